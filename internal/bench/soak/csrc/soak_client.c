/*
 * soak_client.c: the C client of `uvm bench soak` (cli/bench_soak.go),
 * built at run time together with libuvm's sources (so that it speaks
 * the wire protocol of the uvm that runs the soak).
 *
 * Usage: soak_client NAME SEED MAX_ALLOC SLOTS EPOCH OPS, with UVM_SOCKET
 * naming the soak's daemon and UVM_SERVER=daemon; EPOCH is the soak's
 * start (CLOCK_REALTIME, nanoseconds), from which the history's times
 * count; OPS the operations it chooses from, a comma list.
 *
 * It does what the Go client (cli/soak_client.go) does, through uvm.h:
 * SLOTS managed allocations of up to MAX_ALLOC bytes, and at random host
 * writes and reads, read(2) into managed memory, kernels writing, adding
 * and hashing on up to two devices at once, prefetches to any processor,
 * every advice, checks of whole allocations, frees and new allocations;
 * every byte read is checked against a shadow copy kept in ordinary
 * memory. Until its standard input closes; then it checks every
 * allocation whole. It prints the lines the Go client prints:
 *
 *   progress OPS CHECKED   at most every 250 ms, after an operation ended
 *   lost DEVICE MESSAGE    a launch whose device process died (the soak
 *                          kills device processes): its range then holds,
 *                          byte by byte, the old value or the kernel's
 *   wrong JSON             a wrong byte, with the operations on its
 *                          allocation that touched its 2 MiB block; exit 1
 *   error MESSAGE          a call failed unexpectedly; exit 1
 *   done JSON              the counts, at the end
 *
 * SOFTUVM_TEST_SOAK_CORRUPT=NAME@OP makes client NAME change one byte of
 * its first allocation behind the shadow's back at operation OP and read
 * it back: the soak's test that a wrong byte is caught and explained.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uvm.h>

#define PAGE_SIZE 4096u
#define BLOCK_SIZE (2u << 20)
#define HISTORY_KEEP 65536u /* operations kept per allocation */
#define REPORT_KEEP 300u    /* of those, the most a report lists */
#define MAX_DEVICES 2

static const char *name;
static uint64_t rng;
static long op;
static int ndev;
static uint64_t checked, launches_lost;
static uint64_t *hashes; /* host memory the devices write (uvmHostAllocMapped) */
static int pipefd[2];
static long corrupt_at = -1;
static atomic_int stop;
static int64_t epoch_ns;
static double op_at; /* when the operation in progress began, in seconds since the epoch */

static double since_epoch(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - epoch_ns) / 1e9;
}

/* splitmix64: the client's random numbers. */
static uint64_t next64(void)
{
	uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static size_t below(size_t n) { return (size_t)(next64() % n); }

/* What the write kernel puts at byte i: the Go client's soakByte. */
static uint8_t soak_byte(uint64_t seed, size_t i) { return (uint8_t)((seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull) >> 56); }

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
	uint64_t h = 14695981039346656037ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

/* ---- operations and their history ---- */

enum what { W_ALLOC, W_HOST_WRITE, W_HOST_READ, W_READ2, W_WRITE, W_ADD, W_HASH, W_PREFETCH, W_ADVISE };

struct event {
	long op;
	double at;
	size_t off, len;
	uint8_t what;
	int8_t processor; /* the device, or -1 for the host */
	uint8_t advice;
	bool lost;
};

struct slot {
	uint8_t *p, *shadow;
	size_t size;
	struct event *hist;
	size_t n, cap;
	long dropped;
};

static struct slot *slots;
static int nslots;

enum { C_ALLOC, C_FREE, C_HOST_WRITE, C_HOST_READ, C_SYSCALL_WRITE, C_WRITE_KERNEL, C_HASH_KERNEL, C_ADD_KERNEL, C_PREFETCH, C_ADVISE, C_VERIFY_ALL, NCOUNTS };
static const char *count_names[NCOUNTS] = {"alloc", "free", "host-write", "host-read", "syscall-write", "write-kernel", "hash-kernel", "add-kernel", "prefetch", "advise", "verify-all"};
static uint64_t counts[NCOUNTS];

static const char *advice_names[] = {"", "set-read-mostly", "unset-read-mostly", "set-preferred-location", "unset-preferred-location", "set-accessed-by", "unset-accessed-by"};

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	for (char *c = msg; *c; c++)
		if (*c == '\n')
			*c = ' ';
	printf("error op %ld: %s\n", op, msg);
	fflush(stdout);
	exit(1);
}

static void record(struct slot *s, uint8_t what, int processor, int advice, bool lost, size_t off, size_t len)
{
	if (s->n == HISTORY_KEEP) {
		memmove(s->hist, s->hist + HISTORY_KEEP / 2, HISTORY_KEEP / 2 * sizeof *s->hist);
		s->n = HISTORY_KEEP / 2;
		s->dropped += HISTORY_KEEP / 2;
	}
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		if (!(s->hist = realloc(s->hist, s->cap * sizeof *s->hist)))
			fatal("out of memory for the history");
	}
	s->hist[s->n++] = (struct event){.op = op, .at = op_at, .off = off, .len = len, .what = what, .processor = (int8_t)processor, .advice = (uint8_t)advice, .lost = lost};
}

static void processor_name(int p, char *out, size_t cap)
{
	if (p < 0)
		snprintf(out, cap, "cpu");
	else
		snprintf(out, cap, "device %d", p);
}

/* describe names an operation as the Go client does. */
static void describe(const struct event *e, char *out, size_t cap)
{
	char proc[32];
	processor_name(e->processor, proc, sizeof proc);
	const char *died = e->lost ? " (its process died)" : "";
	switch (e->what) {
	case W_ALLOC: snprintf(out, cap, "allocated"); break;
	case W_HOST_WRITE: snprintf(out, cap, "host-write"); break;
	case W_HOST_READ: snprintf(out, cap, "host-read"); break;
	case W_READ2: snprintf(out, cap, "read(2) into it"); break;
	case W_WRITE: snprintf(out, cap, "%s write%s", proc, died); break;
	case W_ADD: snprintf(out, cap, "%s add%s", proc, died); break;
	case W_HASH: snprintf(out, cap, "%s hash%s", proc, died); break;
	case W_PREFETCH: snprintf(out, cap, "prefetch to %s", proc); break;
	case W_ADVISE: snprintf(out, cap, "%s %s", advice_names[e->advice], proc); break;
	default: snprintf(out, cap, "?"); break;
	}
}

/* wrong reports a wrong byte (length 1) or a wrong hash of length bytes
 * at offset at of slot s, with the history of its block, and exits. */
static void wrong(struct slot *s, size_t at, uint64_t got, uint64_t want, size_t length, const char *during) __attribute__((noreturn));
static void wrong(struct slot *s, size_t at, uint64_t got, uint64_t want, size_t length, const char *during)
{
	size_t blk = at / BLOCK_SIZE, matching = 0;
	for (size_t i = 0; i < s->n; i++) {
		const struct event *e = &s->hist[i];
		if (e->off / BLOCK_SIZE <= blk && blk <= (e->off + e->len - 1) / BLOCK_SIZE)
			matching++;
	}
	size_t skip = matching > REPORT_KEEP ? matching - REPORT_KEEP : 0;
	double since = -1;
	for (size_t i = 0, m = 0; i < s->n && since < 0; i++) {
		const struct event *e = &s->hist[i];
		if (e->off / BLOCK_SIZE <= blk && blk <= (e->off + e->len - 1) / BLOCK_SIZE && m++ >= skip)
			since = e->at;
	}
	printf("wrong {\"op\":%ld,\"during\":\"%s\",\"allocation\":\"0x%lx\",\"size\":%zu,\"offset\":%zu,\"page\":%zu,\"length\":%zu,\"got\":%" PRIu64
	       ",\"want\":%" PRIu64 ",\"at_seconds\":%.3f,\"since_seconds\":%.3f,\"history_omitted\":%zu,\"history\":[",
	       op, during, (unsigned long)s->p, s->size, at, at / PAGE_SIZE, length, got, want, since_epoch(), since < 0 ? 0 : since, (size_t)s->dropped + skip);
	bool first = true;
	for (size_t i = 0, m = 0; i < s->n; i++) {
		const struct event *e = &s->hist[i];
		if (!(e->off / BLOCK_SIZE <= blk && blk <= (e->off + e->len - 1) / BLOCK_SIZE) || m++ < skip)
			continue;
		char what[96];
		describe(e, what, sizeof what);
		printf("%s\"op %ld at %.3fs: %s +0x%zx+%zu%s\"", first ? "" : ",", e->op, e->at, what, e->off, e->len, e->off <= at && at < e->off + e->len ? " *" : "");
		first = false;
	}
	printf("]}\n");
	fflush(stdout);
	exit(1);
}

static void verify(struct slot *s, size_t off, size_t len, const char *during)
{
	checked += len;
	if (memcmp(s->p + off, s->shadow + off, len) == 0)
		return;
	for (size_t i = off; i < off + len; i++)
		if (s->p[i] != s->shadow[i])
			wrong(s, i, s->p[i], s->shadow[i], 1, during);
}

/* alloc makes an allocation of up to max_alloc bytes (a quarter of the
 * time at most three pages), whose shadow is zeros. */
static void alloc_slot(struct slot *s, size_t max_alloc)
{
	size_t size = 1 + below(max_alloc);
	if (below(4) == 0)
		size = 1 + below(max_alloc < 3 * PAGE_SIZE ? max_alloc : 3 * PAGE_SIZE);
	*s = (struct slot){.size = size};
	if (uvmMallocManaged((void **)&s->p, size, uvmMemAttachGlobal) != uvmSuccess)
		fatal("uvmMallocManaged(%zu): %s", size, uvmGetLastErrorMessage());
	if (!(s->shadow = calloc(1, size)))
		fatal("out of memory for a shadow of %zu bytes", size);
	counts[C_ALLOC]++;
	record(s, W_ALLOC, -1, 0, false, 0, size);
}

static void free_slot(struct slot *s)
{
	if (uvmFree(s->p) != uvmSuccess)
		fatal("uvmFree(%p): %s", (void *)s->p, uvmGetLastErrorMessage());
	free(s->shadow);
	free(s->hist);
}

/* span picks a range of an n-byte allocation: 64 bytes, a page, three
 * pages, 256 KiB or 4 MiB at most. */
static void span(size_t n, size_t *off, size_t *len)
{
	static const size_t most[] = {64, PAGE_SIZE, 3 * PAGE_SIZE, 256u << 10, 4u << 20};
	size_t m = most[below(5)];
	*len = 1 + below(n < m ? n : m);
	*off = below(n - *len + 1);
}

static int processor(void) { return (int)below((size_t)ndev + 1) - 1; }

static void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)next64();
}

/* ---- kernels ---- */

struct kparams {
	uint8_t *p;
	size_t n;
	uint64_t seed;
	uint64_t *out;
};

static void k_write(unsigned tid, unsigned nthreads, const void *vp)
{
	const struct kparams *k = vp;
	for (size_t i = k->n * tid / nthreads; i < k->n * (tid + 1) / nthreads; i++)
		k->p[i] = soak_byte(k->seed, i);
}

static void k_add(unsigned tid, unsigned nthreads, const void *vp)
{
	const struct kparams *k = vp;
	for (size_t i = k->n * tid / nthreads; i < k->n * (tid + 1) / nthreads; i++)
		k->p[i]++;
}

static void k_hash(unsigned tid, unsigned nthreads, const void *vp)
{
	(void)nthreads;
	const struct kparams *k = vp;
	if (tid == 0)
		*k->out = fnv1a(k->p, k->n);
}

/* lost_to_death says whether err is device's process dying (a kill of
 * the soak's): work launched there is lost, and the failure is sticky
 * (docs/c-api.md), so it resets the device, whose next launch starts a
 * new process. It tells the soak which. */
static bool lost_to_death(int device, uvmError_t err)
{
	const char *msg = uvmGetLastErrorMessage();
	if (err != uvmErrorLaunchFailure || !(strstr(msg, "was killed by signal 9") || strstr(msg, "open stream")))
		return false;
	launches_lost++;
	printf("lost %d %s\n", device, msg);
	fflush(stdout);
	int current = 0;
	uvmGetDevice(&current);
	if (uvmSetDevice(device) != uvmSuccess || uvmDeviceReset() != uvmSuccess)
		fatal("uvmDeviceReset of device %d after its process died: %s", device, uvmGetLastErrorMessage());
	uvmSetDevice(current);
	return true;
}

/* synchronize waits for device d's work; false if its process died. */
static bool synchronize(int d, const char *after)
{
	if (uvmSetDevice(d) != uvmSuccess)
		fatal("uvmSetDevice(%d): %s", d, uvmGetLastErrorMessage());
	uvmError_t err = uvmDeviceSynchronize();
	if (err != uvmSuccess && !lost_to_death(d, err))
		fatal("uvmDeviceSynchronize on device %d after %s: %s", d, after, uvmGetLastErrorMessage());
	return err == uvmSuccess;
}

struct launch {
	int d;
	struct slot *s;
	size_t off, len;
	uint64_t seed;
	bool lost;
};

/* kernels runs one kernel on each device at once (up to two), the first
 * on slot i, then synchronizes and brings the shadows up to date. */
static void kernels(enum what kind, int i)
{
	struct launch ls[MAX_DEVICES];
	int nl = ndev < MAX_DEVICES ? ndev : MAX_DEVICES;
	static const char *kind_names[] = {[W_WRITE] = "write", [W_ADD] = "add", [W_HASH] = "hash"};
	for (int d = 0; d < nl; d++) {
		struct slot *s = &slots[i];
		if (d > 0) {
			s = &slots[(i + d + (int)below((size_t)nslots - 1)) % nslots];
			if (kind == W_HASH && below(3) == 0)
				s = &slots[i]; /* two devices reading one allocation */
		}
		struct launch *l = &ls[d];
		*l = (struct launch){.d = d, .s = s, .seed = next64()};
		span(s->size, &l->off, &l->len);
		struct kparams k = {.p = s->p + l->off, .n = l->len, .seed = l->seed, .out = &hashes[d]};
		uvmKernel_t fn = kind == W_WRITE ? k_write : kind == W_ADD ? k_add : k_hash;
		unsigned threads = kind == W_WRITE ? 1 + (unsigned)below(3) : kind == W_ADD ? 1 + (unsigned)below(2) : 1;
		uvmError_t err = uvmLaunchKernel(d, NULL, threads, fn, &k, sizeof k);
		if (err != uvmSuccess) {
			if (!lost_to_death(d, err))
				fatal("uvmLaunchKernel(%s) on device %d: %s", kind_names[kind], d, uvmGetLastErrorMessage());
			l->lost = true;
		}
	}
	for (int d = 0; d < nl; d++)
		if (!synchronize(d, kind_names[kind]))
			ls[d].lost = true;
	counts[kind == W_WRITE ? C_WRITE_KERNEL : kind == W_ADD ? C_ADD_KERNEL : C_HASH_KERNEL]++;
	for (int d = 0; d < nl; d++) {
		struct launch *l = &ls[d];
		uint8_t *mem = l->s->p + l->off, *shadow = l->s->shadow + l->off;
		record(l->s, (uint8_t)kind, d, 0, l->lost, l->off, l->len);
		char what[64];
		describe(&l->s->hist[l->s->n - 1], what, sizeof what);
		if (kind == W_HASH) {
			if (l->lost)
				continue;
			checked += l->len;
			uint64_t want = fnv1a(shadow, l->len);
			if (hashes[d] != want) {
				char during[96];
				snprintf(during, sizeof during, "host check of a range device %d hashed wrong", d);
				verify(l->s, l->off, l->len, during); /* names the byte if the host sees it too */
				wrong(l->s, l->off, hashes[d], want, l->len, what);
			}
			continue;
		}
		checked += l->len;
		for (size_t j = 0; j < l->len; j++) {
			uint8_t want = kind == W_WRITE ? soak_byte(l->seed, j) : (uint8_t)(shadow[j] + 1);
			if (mem[j] == want)
				shadow[j] = want;
			else if (!(l->lost && mem[j] == shadow[j])) /* not reached before the death */
				wrong(l->s, l->off + j, mem[j], want, 1, what);
		}
	}
	uvmSetDevice(0);
}

/* ---- the loop ---- */

/* The operations a client chooses from at random, with their weights
 * (percent of the operations when all are on): the Go client's soakOps. */
enum { O_HOST_WRITE, O_HOST_READ, O_SYSCALL_WRITE, O_WRITE_KERNEL, O_HASH_KERNEL, O_ADD_KERNEL, O_PREFETCH, O_ADVISE, O_VERIFY_ALL, O_FREE, NOPS };
static const struct {
	const char *name;
	int weight;
} ops[NOPS] = {{"host-write", 25}, {"host-read", 17}, {"syscall-write", 3}, {"write-kernel", 10}, {"hash-kernel", 6}, {"add-kernel", 4},
	       {"prefetch", 14},   {"advise", 10},    {"verify-all", 8},     {"free", 3}};
static bool op_on[NOPS];

static int pick(void)
{
	int total = 0;
	for (int o = 0; o < NOPS; o++)
		total += op_on[o] ? ops[o].weight : 0;
	int k = (int)below((size_t)total);
	for (int o = 0; o < NOPS; o++) {
		if (!op_on[o])
			continue;
		if (k < ops[o].weight)
			return o;
		k -= ops[o].weight;
	}
	return O_HOST_READ; /* not reached */
}

/* parse_ops turns on the operations a comma list names. */
static void parse_ops(char *list)
{
	for (char *save, *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		int o = 0;
		while (o < NOPS && strcmp(ops[o].name, w) != 0)
			o++;
		if (o == NOPS) {
			fprintf(stderr, "soak_client: unknown operation \"%s\"\n", w);
			exit(2);
		}
		op_on[o] = true;
	}
}

static void step(size_t max_alloc)
{
	op_at = since_epoch();
	int i = (int)below((size_t)nslots);
	struct slot *s = &slots[i];
	size_t n = s->size, off, len;
	if (op == corrupt_at) {
		/* The soak's own test: a byte changed behind the shadow's back,
		 * recorded nowhere, then read back as any read would. */
		size_t at = below(slots[0].size);
		slots[0].p[at] = slots[0].shadow[at] ^ 0x5a;
		size_t lo = at > 64 ? at - 64 : 0, hi = at + 64 < slots[0].size ? at + 64 : slots[0].size;
		verify(&slots[0], lo, hi - lo, "host-read");
		return;
	}
	int k = pick();
	if (k == O_HOST_WRITE) {
		span(n, &off, &len);
		uint8_t *src = malloc(len);
		if (!src)
			fatal("out of memory");
		fill_random(src, len);
		memcpy(s->p + off, src, len);
		memcpy(s->shadow + off, src, len);
		free(src);
		record(s, W_HOST_WRITE, -1, 0, false, off, len);
		counts[C_HOST_WRITE]++;
	} else if (k == O_HOST_READ) {
		span(n, &off, &len);
		record(s, W_HOST_READ, -1, 0, false, off, len);
		counts[C_HOST_READ]++;
		verify(s, off, len, "host-read");
	} else if (k == O_SYSCALL_WRITE) {
		/* The kernel writes into managed memory inside read(2). */
		span(n, &off, &len);
		if (len > 32u << 10)
			len = 32u << 10;
		uint8_t src[32u << 10];
		fill_random(src, len);
		if (write(pipefd[1], src, len) != (ssize_t)len)
			fatal("write to a pipe: %m");
		ssize_t got = read(pipefd[0], s->p + off, len);
		if (got != (ssize_t)len)
			fatal("read(2) of %zu bytes into managed memory: %zd: %m", len, got);
		memcpy(s->shadow + off, src, len);
		record(s, W_READ2, -1, 0, false, off, len);
		counts[C_SYSCALL_WRITE]++;
	} else if (k == O_WRITE_KERNEL) {
		kernels(W_WRITE, i);
	} else if (k == O_HASH_KERNEL) {
		kernels(W_HASH, i);
	} else if (k == O_ADD_KERNEL) {
		kernels(W_ADD, i);
	} else if (k == O_PREFETCH) {
		span(n, &off, &len);
		if (below(8) == 0)
			off = 0, len = n;
		int p = processor();
		uvmError_t err = uvmMemPrefetchAsync(s->p + off, len, p, NULL);
		if (err != uvmSuccess && !lost_to_death(0, err)) /* the current device's stream: 0's */
			fatal("uvmMemPrefetchAsync(%p+%zu, %zu, %d): %s", (void *)s->p, off, len, p, uvmGetLastErrorMessage());
		synchronize(0, "a prefetch");
		record(s, W_PREFETCH, p, 0, false, off, len);
		counts[C_PREFETCH]++;
	} else if (k == O_ADVISE) {
		span(n, &off, &len);
		int advice = 1 + (int)below(6), p = processor();
		if (uvmMemAdvise(s->p + off, len, (uvmMemoryAdvise)advice, p) != uvmSuccess)
			fatal("uvmMemAdvise(%p+%zu, %zu, %s, %d): %s", (void *)s->p, off, len, advice_names[advice], p, uvmGetLastErrorMessage());
		record(s, W_ADVISE, p, advice, false, off, len);
		counts[C_ADVISE]++;
	} else if (k == O_VERIFY_ALL) {
		counts[C_VERIFY_ALL]++;
		verify(s, 0, n, "verify-all");
	} else { /* O_FREE */
		verify(s, 0, n, "check before free"); /* every byte of it, before it goes */
		free_slot(s);
		counts[C_FREE]++;
		alloc_slot(s, max_alloc);
		verify(s, 0, s->size, "check of a new allocation");
	}
}

static void *watch_stdin(void *arg)
{
	(void)arg;
	char buf[64];
	while (read(0, buf, sizeof buf) > 0)
		;
	atomic_store(&stop, 1);
	return NULL;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 7) {
		fprintf(stderr, "usage: soak_client NAME SEED MAX_ALLOC SLOTS EPOCH OPS\n");
		return 2;
	}
	name = argv[1];
	rng = strtoull(argv[2], NULL, 10);
	size_t max_alloc = strtoull(argv[3], NULL, 10);
	nslots = atoi(argv[4]);
	epoch_ns = strtoll(argv[5], NULL, 10);
	parse_ops(argv[6]);
	if (max_alloc < 1 || nslots < 2) {
		fprintf(stderr, "soak_client: want MAX_ALLOC >= 1 and SLOTS >= 2\n");
		return 2;
	}
	const char *corrupt = getenv("SOFTUVM_TEST_SOAK_CORRUPT");
	size_t nlen = strlen(name);
	if (corrupt && strncmp(corrupt, name, nlen) == 0 && corrupt[nlen] == '@')
		corrupt_at = atol(corrupt + nlen + 1);
	if (uvmGetDeviceCount(&ndev) != uvmSuccess)
		fatal("uvmGetDeviceCount: %s", uvmGetLastErrorMessage());
	if (ndev < 1)
		fatal("the daemon has no device");
	if (uvmHostAlloc((void **)&hashes, MAX_DEVICES * sizeof *hashes, uvmHostAllocMapped) != uvmSuccess)
		fatal("uvmHostAlloc: %s", uvmGetLastErrorMessage());
	if (pipe(pipefd) != 0)
		fatal("pipe: %m");
	if (!(slots = calloc((size_t)nslots, sizeof *slots)))
		fatal("out of memory");
	for (int i = 0; i < nslots; i++)
		alloc_slot(&slots[i], max_alloc);
	pthread_t t;
	pthread_create(&t, NULL, watch_stdin, NULL);
	double last = 0;
	for (; !atomic_load(&stop); op++) {
		step(max_alloc);
		if (now() - last >= 0.25) {
			printf("progress %ld %" PRIu64 "\n", op + 1, checked);
			fflush(stdout);
			last = now();
		}
	}
	for (int i = 0; i < nslots; i++) {
		verify(&slots[i], 0, slots[i].size, "final check");
		free_slot(&slots[i]);
	}
	if (uvmFreeHost(hashes) != uvmSuccess)
		fatal("uvmFreeHost: %s", uvmGetLastErrorMessage());
	printf("done {\"ops\":{");
	for (int c = 0; c < NCOUNTS; c++)
		printf("%s\"%s\":%" PRIu64, c ? "," : "", count_names[c], counts[c]);
	printf("},\"bytes_checked\":%" PRIu64 ",\"launches_lost\":%" PRIu64 ",\"server_restarts\":-1}\n", checked, launches_lost);
	fflush(stdout);
	return 0;
}
