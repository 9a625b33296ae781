/*
 * fork_stress_test.c: forks of a busy program. Threads fault on their
 * own parts of one managed allocation, a thread prefetches random,
 * overlapping ranges of all of it to every processor, and a thread runs
 * kernels on both devices that write a third part and read a fourth,
 * while the main thread forks again and again. The arenas are smaller
 * than the allocation, so eviction runs with faults in flight.
 *
 * Each 8-byte word says who wrote it and in which round: the round in
 * the high half, the owner and the word's index in the low half. Every
 * page (every chunk, for kernels) has two counters in ordinary memory:
 * the round its writer started and the round it finished. A child
 * checks each word of its copy against them: the round is at least the
 * one finished before the fork began and at most the one started when
 * the fork happened, and the low half is exactly the word's own. The
 * parent checks every page against its round before each overwrite and
 * at the end, so a write lost in any migration, or a child's write that
 * reached the parent, fails.
 *
 * Run by integration/libuvm_test.go with two 8 MiB arenas.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define MiB (1u << 20)
#define PAGE 4096u
#define WORDS_PER_PAGE (PAGE / 8)

enum {
	WRITERS = 3,
	WRITER_PART = 2 * MiB, /* writer w owns [w*WRITER_PART, (w+1)*WRITER_PART) */
	WRITER_PAGES = WRITERS * WRITER_PART / PAGE,
	STABLE_OFF = WRITERS * WRITER_PART, /* written once, read by kernels, moved by prefetches */
	STABLE_LEN = 2 * MiB - PAGE,
	RESULT_OFF = STABLE_OFF + STABLE_LEN, /* one page: what kernels found wrong */
	KERNEL_OFF = RESULT_OFF + PAGE,
	KERNEL_LEN = 8 * MiB,
	CHUNK = 256 * 1024, /* a kernel writes one chunk per launch */
	CHUNKS = KERNEL_LEN / CHUNK,
	TOTAL = KERNEL_OFF + KERNEL_LEN,
	KERNEL_THREADS = 4,
	OWNER_KERNEL = 7,
	FORKS = 6,
	OPS_BETWEEN_FORKS = 40, /* each thread's operations between two forks */
};

static unsigned char *mem;

/* Per page of the writers' parts, then per chunk of the kernels' part. */
static uint64_t started[WRITER_PAGES + CHUNKS], finished[WRITER_PAGES + CHUNKS];
static uint64_t progress[WRITERS + 2]; /* operations done by each thread */
static int stop;

static uint64_t word(uint64_t round, unsigned owner, size_t index) { return round ? round << 32 | (uint64_t)owner << 24 | index : 0; }

static unsigned char stable_byte(size_t i) { return (unsigned char)(i * 131 + i / 4093 + 17); }

/* What a word of the writers' or kernels' parts may be: its owner and
 * index are fixed by its offset, its round is checked by the caller. */
static void word_owner(size_t off, unsigned *owner, size_t *index, size_t *slot)
{
	if (off < STABLE_OFF) {
		*owner = 1 + (unsigned)(off / WRITER_PART);
		*index = (off % WRITER_PART) / 8;
		*slot = off / PAGE;
		return;
	}
	*owner = OWNER_KERNEL;
	*index = (off - KERNEL_OFF) / 8;
	*slot = WRITER_PAGES + (off - KERNEL_OFF) / CHUNK;
}

/* check_words checks [off, off+len) of b word by word: each word is 0 or
 * its own owner and index, with a round in [lo[slot], hi[slot]].
 * It returns the number of bad words and prints the first. */
static size_t check_words(const unsigned char *b, size_t off, size_t len, const uint64_t *lo, const uint64_t *hi, const char *who)
{
	size_t bad = 0;
	for (size_t o = off; o < off + len; o += 8) {
		unsigned owner;
		size_t index, slot;
		word_owner(o, &owner, &index, &slot);
		uint64_t w = *(const uint64_t *)(b + o), round = w >> 32;
		int ok = w == 0 ? lo[slot] == 0 : (w == word(round, owner, index) && round >= lo[slot] && round <= hi[slot]);
		if (!ok && bad++ == 0)
			fprintf(stderr, "%s: word at %#zx is %#llx, want owner %u index %#zx round in [%llu, %llu]\n", who, o,
				(unsigned long long)w, owner, index, (unsigned long long)lo[slot], (unsigned long long)hi[slot]);
	}
	return bad;
}

static uint64_t load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void store(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
	return *s;
}

static void *writer(void *arg)
{
	unsigned w = (unsigned)(uintptr_t)arg;
	uint64_t rng = 0x9e3779b97f4a7c15ull * (w + 1);
	size_t first = w * WRITER_PART / PAGE, bad = 0;
	while (!__atomic_load_n(&stop, __ATOMIC_SEQ_CST) && bad == 0) {
		size_t p = first + xorshift(&rng) % (WRITER_PART / PAGE);
		uint64_t done = load(&finished[p]), *words = (uint64_t *)(mem + p * PAGE);
		/* Before the overwrite: exactly the last round written. */
		bad = check_words(mem, p * PAGE, PAGE, &finished[0], &finished[0], "writer");
		store(&started[p], done + 1);
		for (size_t i = 0; i < WORDS_PER_PAGE; i++)
			words[i] = word(done + 1, w + 1, (p - first) * WORDS_PER_PAGE + i);
		store(&finished[p], done + 1);
		__atomic_add_fetch(&progress[w], 1, __ATOMIC_SEQ_CST);
	}
	return (void *)(uintptr_t)bad;
}

static void *prefetcher(void *arg)
{
	(void)arg;
	uint64_t rng = 0x2545f4914f6cdd1dull;
	static const int where[] = {0, 1, uvmCpuDeviceId};
	size_t failures = 0;
	while (!__atomic_load_n(&stop, __ATOMIC_SEQ_CST)) {
		size_t pages = 1 + xorshift(&rng) % (3 * MiB / PAGE);
		size_t first = xorshift(&rng) % (TOTAL / PAGE - pages + 1);
		int dst = where[xorshift(&rng) % 3];
		/* A prefetch is queued on the default stream: each is waited
		 * for, so that one is in flight at a time, as the writers'
		 * faults and the forks race with it. */
		if ((uvmMemPrefetchAsync(mem + first * PAGE, pages * PAGE, dst, NULL) != uvmSuccess || uvmStreamSynchronize(NULL) != uvmSuccess) &&
		    failures++ == 0)
			fprintf(stderr, "prefetch of %zu pages at %#zx to %d: %s\n", pages, first * PAGE, dst, uvmGetLastErrorMessage());
		__atomic_add_fetch(&progress[WRITERS], 1, __ATOMIC_SEQ_CST);
	}
	return (void *)(uintptr_t)failures;
}

struct chunk_params {
	unsigned char *mem;
	size_t chunk;
	uint64_t round;
	size_t result; /* the result word this launch adds to */
};

/* chunk_kernel writes its round into every word of a chunk and checks a
 * share of the stable part, adding what it found wrong to a result word. */
static void chunk_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct chunk_params *p = params;
	size_t per = CHUNK / 8 / nthreads;
	uint64_t *words = (uint64_t *)(p->mem + KERNEL_OFF + p->chunk * CHUNK);
	for (size_t i = tid * per; i < (tid + 1) * per; i++)
		words[i] = word(p->round, OWNER_KERNEL, p->chunk * (CHUNK / 8) + i);
	size_t share = STABLE_LEN / nthreads, bad = 0;
	for (size_t i = tid * share; i < (tid + 1) * share; i += 61)
		bad += p->mem[STABLE_OFF + i] != stable_byte(i);
	if (bad)
		__atomic_add_fetch((uint64_t *)(p->mem + RESULT_OFF) + p->result, bad, __ATOMIC_SEQ_CST);
}

static void *launcher(void *arg)
{
	(void)arg;
	uint64_t rng = 0xda942042e4dd58b5ull;
	uvmStream_t streams[2];
	size_t bad = 0;
	for (int d = 0; d < 2; d++) {
		if (uvmSetDevice(d) != uvmSuccess || uvmStreamCreate(&streams[d]) != uvmSuccess) {
			fprintf(stderr, "launcher: stream on device %d: %s\n", d, uvmGetLastErrorMessage());
			return (void *)1;
		}
	}
	for (size_t n = 0; !__atomic_load_n(&stop, __ATOMIC_SEQ_CST) && bad == 0; n++) {
		size_t c = xorshift(&rng) % CHUNKS, slot = WRITER_PAGES + c;
		uint64_t done = load(&finished[slot]);
		int d = (int)(n % 2);
		struct chunk_params p = {.mem = mem, .chunk = c, .round = done + 1, .result = (size_t)d};
		store(&started[slot], done + 1);
		if (uvmLaunchKernel(d, streams[d], KERNEL_THREADS, chunk_kernel, &p, sizeof p) != uvmSuccess ||
		    uvmStreamSynchronize(streams[d]) != uvmSuccess) {
			fprintf(stderr, "launcher: kernel %zu on device %d: %s\n", n, d, uvmGetLastErrorMessage());
			return (void *)1;
		}
		store(&finished[slot], done + 1);
		/* Read back from the host: exactly this round. */
		bad = check_words(mem, KERNEL_OFF + c * CHUNK, CHUNK, &finished[0], &finished[0], "launcher");
		__atomic_add_fetch(&progress[WRITERS + 1], 1, __ATOMIC_SEQ_CST);
	}
	for (int d = 0; d < 2; d++)
		uvmStreamDestroy(streams[d]);
	return (void *)(uintptr_t)bad;
}

/* wait_for_progress returns once every thread has done ops more
 * operations than in from, or one of them has stopped early. */
static void wait_for_progress(const uint64_t *from, uint64_t ops, pthread_t *threads)
{
	for (;;) {
		int behind = 0;
		for (int i = 0; i < WRITERS + 2; i++) {
			if (load(&progress[i]) < from[i] + ops) {
				if (pthread_tryjoin_np(threads[i], &(void *){0}) == 0) {
					fprintf(stderr, "thread %d stopped early\n", i);
					CHECK(0);
					exit(check_done("fork_stress_test"));
				}
				behind = 1;
			}
		}
		if (!behind)
			return;
		sched_yield();
	}
}

struct fill_params {
	uint64_t *words;
	size_t n;
};

/* fill_kernel writes 3*i into word i: the child's own kernel. */
static void fill_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct fill_params *p = params;
	for (size_t i = tid; i < p->n; i += nthreads)
		p->words[i] = i * 3;
}

/* child checks its copy against the rounds finished before the fork and
 * started at it, then writes over its copy (which the parent must never
 * see) and makes a session of its own with a kernel. */
static int child(const uint64_t *finished_before)
{
	uint64_t started_at_fork[WRITER_PAGES + CHUNKS];
	memcpy(started_at_fork, started, sizeof started_at_fork);
	size_t bad = check_words(mem, 0, STABLE_OFF, finished_before, started_at_fork, "child");
	bad += check_words(mem, KERNEL_OFF, KERNEL_LEN, finished_before, started_at_fork, "child");
	for (size_t i = 0; i < STABLE_LEN; i++)
		if (mem[STABLE_OFF + i] != stable_byte(i) && bad++ == 0)
			fprintf(stderr, "child: stable byte %#zx is %#x, want %#x\n", i, mem[STABLE_OFF + i], stable_byte(i));
	if (bad)
		return 20;
	memset(mem, 0xc5, TOTAL);
	uint64_t *own;
	const size_t n = MiB / 8;
	struct fill_params fp;
	if (uvmMallocManaged((void **)&own, MiB, uvmMemAttachGlobal) != uvmSuccess)
		return 21;
	fp = (struct fill_params){.words = own, .n = n};
	if (uvmSetDevice(1) != uvmSuccess || uvmLaunchKernel(1, NULL, 2, fill_kernel, &fp, sizeof fp) != uvmSuccess || uvmDeviceSynchronize() != uvmSuccess ||
	    uvmMemPrefetchAsync(own, MiB, 0, NULL) != uvmSuccess) {
		fprintf(stderr, "child: own session: %s\n", uvmGetLastErrorMessage());
		return 22;
	}
	for (size_t i = 0; i < n; i++)
		if (own[i] != i * 3) {
			fprintf(stderr, "child: word %zu of its own memory is %#llx, want %#zx\n", i, (unsigned long long)own[i], i * 3);
			return 23;
		}
	if (uvmFree(own) != uvmSuccess)
		return 24;
	return 0;
}

int main(void)
{
	CHECK_OK(uvmMallocManaged((void **)&mem, TOTAL, uvmMemAttachGlobal));
	if (!mem)
		return check_done("fork_stress_test");
	for (size_t i = 0; i < STABLE_LEN; i++)
		mem[STABLE_OFF + i] = stable_byte(i);

	pthread_t threads[WRITERS + 2];
	for (unsigned w = 0; w < WRITERS; w++)
		CHECK(pthread_create(&threads[w], NULL, writer, (void *)(uintptr_t)w) == 0);
	CHECK(pthread_create(&threads[WRITERS], NULL, prefetcher, NULL) == 0);
	CHECK(pthread_create(&threads[WRITERS + 1], NULL, launcher, NULL) == 0);

	uint64_t mark[WRITERS + 2] = {0};
	for (int f = 0; f < FORKS; f++) {
		wait_for_progress(mark, OPS_BETWEEN_FORKS, threads);
		for (int i = 0; i < WRITERS + 2; i++)
			mark[i] = load(&progress[i]);
		uint64_t finished_before[WRITER_PAGES + CHUNKS];
		for (size_t i = 0; i < WRITER_PAGES + CHUNKS; i++)
			finished_before[i] = load(&finished[i]);
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
		if (got != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			fprintf(stderr, "fork %d: child status %#x\n", f, status);
	}
	/* One more round of work after the last child, so that its writes,
	 * had they reached us, would be checked over. */
	wait_for_progress(mark, OPS_BETWEEN_FORKS, threads);
	__atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < WRITERS + 2; i++) {
		void *bad = NULL;
		CHECK(pthread_join(threads[i], &bad) == 0);
		CHECK(bad == NULL);
	}

	/* Every word exactly its last round, the stable part as written, and
	 * the kernels found nothing wrong in it. */
	CHECK(check_words(mem, 0, STABLE_OFF, finished, finished, "parent") == 0);
	CHECK(check_words(mem, KERNEL_OFF, KERNEL_LEN, finished, finished, "parent") == 0);
	size_t bad = 0;
	for (size_t i = 0; i < STABLE_LEN; i++)
		bad += mem[STABLE_OFF + i] != stable_byte(i);
	CHECK(bad == 0);
	CHECK(((uint64_t *)(mem + RESULT_OFF))[0] == 0 && ((uint64_t *)(mem + RESULT_OFF))[1] == 0);
	uint64_t launches = load(&progress[WRITERS + 1]), prefetches = load(&progress[WRITERS]);
	CHECK(launches >= (FORKS + 1) * OPS_BETWEEN_FORKS && prefetches >= (FORKS + 1) * OPS_BETWEEN_FORKS);
	CHECK_OK(uvmFree(mem));
	return check_done("fork_stress_test");
}
