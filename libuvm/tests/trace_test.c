/*
 * trace_test.c: a C program's launches and synchronizations in its trace
 * under the fault coherence model, which the device process (a fork of
 * the program, devproc.c) reports to the server. Run by
 * integration/libuvm_test.go with a private server (UVM_BIN) and 2
 * devices.
 *
 * The test runs itself again as a child with UVM_TRACE set (the server
 * reads it from the environment the client started with): the child
 * launches kernels on two streams of device 1 and synchronizes them, and
 * prints what it did. The parent then exports the child's trace as CSV
 * with `$UVM_BIN trace export` and checks that it holds exactly those
 * launches (each kernel's name is "c:0x" and its address), on the right
 * streams and device, in order, each one after the synchronization
 * before it on its stream and before the one after it, and exactly those
 * synchronizations.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define ROUNDS 3
#define BURST 70 /* launches between two synchronizations: more than a report batch */
#define DEVICE 1

static void nop(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid;
	(void)nthreads;
	(void)params;
}

/* spin: runs for about 2 ms, so that a launch has a length. */
static void spin(unsigned tid, unsigned nthreads, const void *params)
{
	(void)nthreads;
	(void)params;
	if (tid != 0)
		return;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do
		clock_gettime(CLOCK_MONOTONIC, &t);
	while ((t.tv_sec - t0.tv_sec) * 1000000000l + (t.tv_nsec - t0.tv_nsec) < 2000000l);
}

/* What one stream should show, in order: 'n' a nop launch, 's' a spin
 * launch, 'y' a synchronization. */
struct plan {
	char ops[2][ROUNDS * 8 + BURST + 8];
	int len[2];
	int launches, syncs;
};

static void add(struct plan *p, int st, char op)
{
	p->ops[st][p->len[st]++] = op;
	if (op == 'y')
		p->syncs++;
	else
		p->launches++;
}

static void plan_of(struct plan *p)
{
	memset(p, 0, sizeof *p);
	for (int r = 0; r < ROUNDS; r++) {
		add(p, 0, 's');
		add(p, 0, 'n');
		add(p, 1, 'n');
		add(p, 1, 's');
		add(p, 0, 'y');
		add(p, 1, 'y');
	}
	for (int i = 0; i < BURST; i++)
		add(p, 1, 'n');
	add(p, 1, 'y');
	add(p, 0, 'n');
	add(p, 0, 'y');
}

/* child runs the plan, after writing its kernels' names (addresses, which
 * differ from the parent's: the program is position-independent) to the
 * file names. */
static int child(const char *names)
{
	FILE *f = fopen(names, "w");
	CHECK(f != NULL);
	if (f) {
		fprintf(f, "c:0x%lx c:0x%lx\n", (unsigned long)(uintptr_t)nop, (unsigned long)(uintptr_t)spin);
		fclose(f);
	}
	struct plan p;
	plan_of(&p);
	uvmStream_t st[2];
	CHECK_OK(uvmSetDevice(DEVICE));
	CHECK_OK(uvmStreamCreate(&st[0]));
	CHECK_OK(uvmStreamCreate(&st[1]));
	int at[2] = {0, 0};
	/* Interleave the streams as plan_of lists them: each round's
	 * launches on both, then the synchronizations. */
	for (int r = 0; r < ROUNDS; r++) {
		for (int s = 0; s < 2; s++)
			for (; p.ops[s][at[s]] != 'y'; at[s]++)
				CHECK_OK(uvmLaunchKernel(DEVICE, st[s], p.ops[s][at[s]] == 's' ? 1 : 3, p.ops[s][at[s]] == 's' ? spin : nop, NULL, 0));
		for (int s = 0; s < 2; s++) {
			CHECK_OK(uvmStreamSynchronize(st[s]));
			at[s]++;
		}
	}
	for (int s = 1; s >= 0; s--) {
		for (; p.ops[s][at[s]] != 'y'; at[s]++)
			CHECK_OK(uvmLaunchKernel(DEVICE, st[s], 2, nop, NULL, 0));
		CHECK_OK(uvmStreamSynchronize(st[s]));
		at[s]++;
	}
	CHECK(at[0] == p.len[0] && at[1] == p.len[1]);
	return check_done("trace_test (child)");
}

/* A row of the CSV export that matters here. */
struct row {
	char kind[16];
	long long time, pid, duration, stream;
	char processor[16], name[64];
};

/* parse_row reads one CSV row (kind, time_ns, pid, thread, processor,
 * from, to, range, addr, pages, bytes, fault_kind, write, prefetched,
 * cause, duration_ns, stream, name); cells are empty where the kind has
 * no such field, processors are named ("device 1"), and no cell this
 * test reads is quoted. */
static bool parse_row(char *line, struct row *r)
{
	char *cell[18];
	int n = 0;
	for (char *p = line; n < 18;) {
		cell[n++] = p;
		char *comma = strchr(p, ',');
		if (!comma)
			break;
		*comma = '\0';
		p = comma + 1;
	}
	if (n != 18)
		return false;
	cell[17][strcspn(cell[17], "\r\n")] = '\0';
	snprintf(r->kind, sizeof r->kind, "%s", cell[0]);
	r->time = atoll(cell[1]);
	r->pid = atoll(cell[2]);
	snprintf(r->processor, sizeof r->processor, "%s", cell[4]);
	r->duration = atoll(cell[15]);
	r->stream = atoll(cell[16]);
	snprintf(r->name, sizeof r->name, "%s", cell[17]);
	return true;
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "child") == 0)
		return child(argv[2]);
	const char *bin = getenv("UVM_BIN");
	if (!bin) {
		fprintf(stderr, "trace_test: UVM_BIN names the uvm binary (integration/libuvm_test.go sets it)\n");
		return 1;
	}
	char dir[] = "/tmp/uvm-trace-test-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	char tracePath[256], csvPath[256], namesPath[256], env[300];
	snprintf(tracePath, sizeof tracePath, "%s/c.uvmtrace", dir);
	snprintf(csvPath, sizeof csvPath, "%s/c.csv", dir);
	snprintf(namesPath, sizeof namesPath, "%s/names", dir);
	snprintf(env, sizeof env, "UVM_TRACE=%s", tracePath);

	pid_t pid = fork();
	if (pid == 0) {
		putenv(env);
		execl("/proc/self/exe", argv[0], "child", namesPath, (char *)NULL);
		_exit(127);
	}
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	/* The private server closes the trace after the child's session
	 * ends: until then the export says it is cut short. */
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "'%s' trace export --format csv --out '%s' '%s' 2>/dev/null", bin, csvPath, tracePath);
	int rc = -1;
	for (int i = 0; i < 200 && rc != 0; i++) {
		rc = system(cmd);
		if (rc != 0)
			usleep(50000);
	}
	CHECK(rc == 0);

	struct plan p;
	plan_of(&p);
	char nopName[64] = "", spinName[64] = "";
	FILE *f = fopen(namesPath, "r");
	CHECK(f && fscanf(f, "%63s %63s", nopName, spinName) == 2);
	if (f)
		fclose(f);
	f = fopen(csvPath, "r");
	CHECK(f != NULL);
	long long streams[2] = {-1, -1};
	int at[2] = {0, 0};
	long long prevSyncEnd[2] = {0, 0}, lastLaunchEnd[2] = {0, 0};
	int launches = 0, syncs = 0;
	char line[4096];
	while (f && fgets(line, sizeof line, f)) {
		struct row r;
		if (!parse_row(line, &r) || (strcmp(r.kind, "launch") != 0 && strcmp(r.kind, "sync") != 0))
			continue;
		CHECK(r.pid == pid);
		CHECK(strcmp(r.processor, "device 1") == 0); /* DEVICE, as the export names it */
		if (strcmp(r.kind, "launch") == 0)
			launches++;
		else
			syncs++;
		int s = r.stream == streams[0] ? 0 : r.stream == streams[1] ? 1 : -1;
		if (s < 0 && strcmp(r.kind, "launch") == 0) {
			/* A stream's first event names it: the plan's first op on
			 * stream 0 is a spin, on stream 1 a nop. */
			s = strcmp(r.name, spinName) == 0 ? 0 : 1;
			CHECK(streams[s] == -1);
			streams[s] = r.stream;
		}
		CHECK(s >= 0);
		if (s < 0)
			continue;
		CHECK(at[s] < p.len[s]);
		if (at[s] >= p.len[s])
			continue;
		char want = p.ops[s][at[s]++];
		if (want == 'y') {
			CHECK(strcmp(r.kind, "sync") == 0);
			CHECK(r.duration >= 0);
			CHECK(r.time >= lastLaunchEnd[s]); /* after the kernels before it ended */
			prevSyncEnd[s] = r.time + r.duration;
			continue;
		}
		CHECK(strcmp(r.kind, "launch") == 0);
		CHECK(strcmp(r.name, want == 's' ? spinName : nopName) == 0);
		CHECK(r.time >= prevSyncEnd[s]);      /* after the synchronization before it answered */
		CHECK(r.time >= lastLaunchEnd[s]);    /* after the launch before it */
		lastLaunchEnd[s] = r.time + r.duration; /* the format has no launch length: its start */
	}
	if (f)
		fclose(f);
	CHECK(launches == p.launches);
	CHECK(syncs == p.syncs);
	CHECK(at[0] == p.len[0] && at[1] == p.len[1]);
	if (check_failures)
		fprintf(stderr, "trace_test: %d launches and %d synchronizations in %s, want %d and %d\n", launches, syncs, csvPath, p.launches,
			p.syncs);
	else {
		unlink(tracePath);
		unlink(csvPath);
		unlink(namesPath);
		rmdir(dir);
	}
	return check_done("trace_test");
}
