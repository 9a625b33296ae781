/* readio: the kernel writes into managed memory (read(2) from a file and
 * from a pipe) and reads from it (write(2)), page faults taken inside
 * system calls. Under a small host budget the buffers' pages are partly
 * on the device when the system call touches them. */
#include "run.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#define SIZE (12u << 20)

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k <= 0)
			return -1;
		p += k, n -= (size_t)k;
	}
	return 0;
}

static ssize_t read_all(int fd, unsigned char *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, p + got, n - got);
		if (k < 0)
			return -1;
		if (k == 0)
			break;
		got += (size_t)k;
	}
	return (ssize_t)got;
}

struct pipe_writer {
	int fd;
	const unsigned char *src;
};

static void *feed(void *arg)
{
	struct pipe_writer *w = arg;
	write_all(w->fd, w->src, SIZE);
	close(w->fd);
	return NULL;
}

int main(void)
{
	unsigned char *src = malloc(SIZE), *dst = malloc(SIZE);
	CHECK(src && dst);
	if (!src || !dst)
		return run_done("readio");
	MANAGED(src);
	MANAGED(dst);
	fill(src, SIZE, 5);

	/* write(2) from managed memory into a file, read(2) it back into
	 * other managed memory, in one call and in odd-sized pieces. */
	char path[] = "/tmp/uvm-run-readio-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	if (fd < 0)
		return run_done("readio");
	unlink(path);
	CHECK(write_all(fd, src, SIZE) == 0);
	CHECK(lseek(fd, 0, SEEK_SET) == 0);
	CHECK(read_all(fd, dst, SIZE) == (ssize_t)SIZE);
	CHECK(memcmp(src, dst, SIZE) == 0);
	memset(dst, 0, SIZE);
	CHECK(lseek(fd, 0, SEEK_SET) == 0);
	size_t off = 0;
	while (off < SIZE) {
		size_t piece = 12345 + off % 70000;
		if (piece > SIZE - off)
			piece = SIZE - off;
		ssize_t k = pread(fd, dst + off, piece, (off_t)off);
		CHECK(k == (ssize_t)piece);
		if (k <= 0)
			break;
		off += (size_t)k;
	}
	CHECK(verify(dst, SIZE, 5) == 0);
	close(fd);

	/* A pipe: another thread writes from managed memory while this one
	 * reads into managed memory. */
	int p[2];
	CHECK(pipe(p) == 0);
	memset(dst, 0, SIZE);
	struct pipe_writer w = {p[1], src};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, feed, &w) == 0);
	CHECK(read_all(p[0], dst, SIZE) == (ssize_t)SIZE);
	pthread_join(t, NULL);
	close(p[0]);
	CHECK(verify(dst, SIZE, 5) == 0);
	free(src);
	free(dst);
	return run_done("readio");
}
