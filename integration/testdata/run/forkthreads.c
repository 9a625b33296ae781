/* forkthreads: forks of a busy program. Four threads each rewrite a
 * buffer of their own, round after round, and malloc, fill, check and
 * free a temporary buffer between rounds, while the main thread forks
 * again and again. A child checks its copy of a buffer written before the
 * threads started, byte for byte, and each thread's buffer page by page:
 * every byte belongs to a round between the last one its thread finished
 * before the fork and the one it had started at the fork. Then it frees
 * its copies and allocates memory of its own. The parent checks each
 * buffer before every rewrite and at the end, so a child's write that
 * reached it shows. */
#include "run.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 4
#define SIZE (2u << 20)
#define STABLE_SIZE (4u << 20)
#define FORKS 6
#define ROUNDS_BETWEEN_FORKS 3

static unsigned char *buffers[THREADS], *stable;
static unsigned started[THREADS], finished[THREADS];
static int stop;

static unsigned load(const unsigned *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }

/* round_ok reports whether byte i of a buffer filled with seed s (fill's
 * pattern) could come from a round in [lo, hi]: a byte keeps only the
 * seed's low 8 bits. */
static unsigned seed_of(unsigned thread, unsigned round) { return round * 16 + thread; }

static int round_ok(const unsigned char *p, size_t i, unsigned thread, unsigned lo, unsigned hi)
{
	unsigned char seed = (unsigned char)(p[i] ^ (unsigned char)((i >> 12) ^ (i * 7)));
	if (lo == 0 && p[i] == 0)
		return 1; /* not written yet */
	for (unsigned r = lo ? lo : 1; r <= hi; r++)
		if ((unsigned char)seed_of(thread, r) == seed)
			return 1;
	return 0;
}

static void *worker(void *arg)
{
	unsigned t = (unsigned)(uintptr_t)arg;
	size_t bad = 0;
	while (!__atomic_load_n(&stop, __ATOMIC_SEQ_CST) && bad == 0) {
		unsigned r = load(&finished[t]);
		if (r)
			bad += verify(buffers[t], SIZE, seed_of(t, r));
		__atomic_store_n(&started[t], r + 1, __ATOMIC_SEQ_CST);
		fill(buffers[t], SIZE, seed_of(t, r + 1));
		__atomic_store_n(&finished[t], r + 1, __ATOMIC_SEQ_CST);
		unsigned char *tmp = malloc(SIZE / 2);
		if (!tmp)
			return (void *)1;
		fill(tmp, SIZE / 2, t + 7);
		bad += verify(tmp, SIZE / 2, t + 7);
		free(tmp);
	}
	if (bad)
		fprintf(stderr, "thread %u: %zu bad bytes\n", t, bad);
	return (void *)(uintptr_t)bad;
}

static int child(const unsigned *finished_before)
{
	unsigned started_at_fork[THREADS];
	memcpy(started_at_fork, started, sizeof started);
	CHECK(verify(stable, STABLE_SIZE, 99) == 0);
	for (unsigned t = 0; t < THREADS; t++) {
		size_t bad = 0;
		for (size_t i = 0; i < SIZE; i++)
			if (!round_ok(buffers[t], i, t, finished_before[t], started_at_fork[t]) && bad++ == 0)
				fprintf(stderr, "child: thread %u's byte %#zx is %#x, not of a round in [%u, %u]\n", t, i, buffers[t][i],
					finished_before[t], started_at_fork[t]);
		CHECK(bad == 0);
	}
	/* Writes to the copies stay here. */
	for (unsigned t = 0; t < THREADS; t++)
		memset(buffers[t], 0xee, SIZE);
	memset(stable, 0xee, STABLE_SIZE);
	for (unsigned t = 0; t < THREADS; t++)
		free(buffers[t]);
	free(stable);
	unsigned char *own = malloc(SIZE);
	CHECK(own != NULL);
	if (own) {
		MANAGED(own);
		fill(own, SIZE, 5);
		CHECK(verify(own, SIZE, 5) == 0);
		free(own);
	}
	fflush(stderr);
	return run_failures ? 1 : 0;
}

static void wait_rounds(const unsigned *from, unsigned rounds)
{
	for (;;) {
		int behind = 0;
		for (unsigned t = 0; t < THREADS; t++)
			behind |= load(&finished[t]) < from[t] + rounds;
		if (!behind)
			return;
		sched_yield();
	}
}

int main(void)
{
	stable = malloc(STABLE_SIZE);
	CHECK(stable != NULL);
	for (unsigned t = 0; t < THREADS; t++) {
		buffers[t] = calloc(1, SIZE);
		CHECK(buffers[t] != NULL);
	}
	if (run_failures)
		return run_done("forkthreads");
	MANAGED(stable);
	MANAGED(buffers[0]);
	fill(stable, STABLE_SIZE, 99);
	pthread_t threads[THREADS];
	for (unsigned t = 0; t < THREADS; t++)
		CHECK(pthread_create(&threads[t], NULL, worker, (void *)(uintptr_t)t) == 0);

	unsigned mark[THREADS] = {0};
	for (int f = 0; f < FORKS; f++) {
		wait_rounds(mark, ROUNDS_BETWEEN_FORKS);
		unsigned finished_before[THREADS];
		for (unsigned t = 0; t < THREADS; t++)
			mark[t] = finished_before[t] = load(&finished[t]);
		fflush(NULL);
		pid_t pid = fork();
		if (pid == 0)
			_exit(child(finished_before));
		CHECK(pid > 0);
		int status = 0;
		pid_t got;
		while ((got = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
			;
		CHECK(got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	wait_rounds(mark, ROUNDS_BETWEEN_FORKS); /* the children's writes, had they reached us, are checked over */
	__atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
	for (unsigned t = 0; t < THREADS; t++) {
		void *bad = (void *)1;
		CHECK(pthread_join(threads[t], &bad) == 0 && bad == NULL);
		CHECK(verify(buffers[t], SIZE, seed_of(t, load(&finished[t]))) == 0);
		free(buffers[t]);
	}
	CHECK(verify(stable, STABLE_SIZE, 99) == 0);
	free(stable);
	printf("forkthreads: %d forks\n", FORKS);
	return run_done("forkthreads");
}
