/* fork: a child gets a copy of the parent's managed buffer, as fork gives
 * copies of ordinary memory. Each side writes its own copy while the
 * other checks that it still sees its own bytes; the child frees its
 * copy and allocates managed memory of its own; both exit 0. */
#include "run.h"

#include <sys/wait.h>
#include <unistd.h>

#define SIZE (8u << 20)

static void must_read(int fd)
{
	char c;
	while (read(fd, &c, 1) < 0)
		;
}

static void must_write(int fd)
{
	char c = 'x';
	while (write(fd, &c, 1) < 0)
		;
}

static int child(unsigned char *p, int from_parent, int to_parent)
{
	must_read(from_parent); /* the parent has rewritten its copy */
	CHECK(verify(p, SIZE, 1) == 0); /* ours is still as it was at the fork */
	fill(p, SIZE, 2);
	CHECK(verify(p, SIZE, 2) == 0);
	must_write(to_parent); /* the parent checks its copy now */
	free(p);                /* a forked copy: unmapped, not a double free */
	unsigned char *q = malloc(SIZE); /* the child's own managed memory */
	CHECK(q != NULL);
	if (q) {
		MANAGED(q);
		fill(q, SIZE, 3);
		CHECK(verify(q, SIZE, 3) == 0);
		free(q);
	}
	return run_done("fork child");
}

int main(void)
{
	unsigned char *p = malloc(SIZE);
	CHECK(p != NULL);
	if (!p)
		return run_done("fork");
	MANAGED(p);
	fill(p, SIZE, 1);
	int down[2], up[2];
	CHECK(pipe(down) == 0 && pipe(up) == 0);
	fflush(stdout);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
	{
		int rc = child(p, down[0], up[1]);
		fflush(stdout);
		_exit(rc);
	}
	fill(p, SIZE, 4); /* the parent's copy changes... */
	must_write(down[1]);
	must_read(up[0]); /* ...and the child has written its own */
	CHECK(verify(p, SIZE, 4) == 0);
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(verify(p, SIZE, 4) == 0);
	free(p);
	return run_done("fork");
}
