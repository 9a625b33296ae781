/* exec: a program with a managed buffer executes itself; the new image
 * (a new process image, so a new session) allocates managed memory too.
 * `exec child` is that second image. */
#include "run.h"

#include <unistd.h>

#define SIZE (4u << 20)

static int use_buffer(const char *who, unsigned seed)
{
	unsigned char *p = malloc(SIZE);
	CHECK(p != NULL);
	if (!p)
		return 0;
	MANAGED(p);
	fill(p, SIZE, seed);
	CHECK(verify(p, SIZE, seed) == 0);
	printf("%s: buffer of %u bytes %s\n", who, SIZE, in_window(p) ? "managed" : "not managed");
	return 1;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "child") == 0) {
		use_buffer("exec child", 9);
		return run_done("exec child");
	}
	use_buffer("exec parent", 8); /* left allocated: exec drops it */
	fflush(stdout);
	char *args[] = {argv[0], "child", NULL};
	execv("/proc/self/exe", args);
	perror("exec: execv /proc/self/exe");
	return 1;
}
