/* statics: a program whose big buffers are static arrays, as gzip's are.
 * Under `uvm run` its writable data segment becomes managed memory before
 * main, contents kept: the initialized table still holds its values, the
 * zero array reads as zeros, writes stick while pages move under a host
 * budget, and a forked child gets its own copy. */
#include <sys/wait.h>
#include <unistd.h>

#include "run.h"

#define ZEROS (6u << 20)
#define TABLE 65536

static unsigned char zeros[ZEROS];
static int table[TABLE] = {[0 ... TABLE - 1] = 7};

/* mapped_from_host_file reports whether p lies in a mapping of softuvm's
 * host memfd: what managed memory is, wherever it lies. */
static int mapped_from_host_file(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int found = 0;
	while (f && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
			found = strstr(line, "softuvm-host") != NULL;
	}
	if (f)
		fclose(f);
	return found;
}

int main(void)
{
	CHECK(mapped_from_host_file(zeros + ZEROS / 2) == expect_managed());
	size_t bad = 0;
	for (int i = 0; i < TABLE; i++)
		bad += table[i] != 7;
	CHECK(bad == 0);
	bad = 0;
	for (size_t i = 0; i < ZEROS; i++)
		bad += zeros[i] != 0;
	CHECK(bad == 0);
	fill(zeros, ZEROS, 3);
	for (int pass = 0; pass < 2; pass++)
		CHECK(verify(zeros, ZEROS, 3) == 0);
	table[5] = 9;

	pid_t pid = fork();
	if (pid == 0) {
		int rc = verify(zeros, ZEROS, 3) != 0 || table[5] != 9;
		fill(zeros, ZEROS, 4);
		rc |= verify(zeros, ZEROS, 4) != 0;
		_exit(rc);
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(verify(zeros, ZEROS, 3) == 0); /* the child wrote its own copy */
	return run_done("statics");
}
