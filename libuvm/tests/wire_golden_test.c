/*
 * wire_golden_test.c: libuvm's side of the wire protocol against the
 * golden fixtures of internal/wire/testdata/golden, the bytes the Go side
 * is held to as well (TestGolden in internal/wire). Each message libuvm
 * sends is built with the library's own encoder (wire.c) and compared
 * byte for byte; each message it reads is decoded as the library reads
 * it, and every field checked. The values are the fixtures' (each file
 * lists them). A fixture this file does not know fails the test, so that
 * a new message form gets a place here, or in go_only.
 *
 * The fixtures are read from $UVM_GOLDEN_DIR, else from
 * ../internal/wire/testdata/golden: integration/libuvm_test.go runs the
 * test in integration/. No server is needed.
 */
#include "../src/internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

/* Messages libuvm neither sends nor reads: monitors' and daemons'. */
static const char *const go_only[] = {"stats-request", "stats-reply", "info-request", "info-reply", "replace-request", "replace-reply"};

#define ADDR 0x600000200000ul
#define ADDR2 0x600000400000ul

static const char *dir;
static char used[256][64]; /* the fixtures read */
static int nused;

struct fixture {
	const char *name;
	uint8_t b[1024];
	size_t n;
};

static void fail(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s/%s.hex: ", dir, name);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	check_failures++;
}

/* load reads a fixture: bytes in two hex digits, comments from # to the
 * end of the line. */
static bool load(const char *name, struct fixture *f)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s.hex", dir, name);
	if (nused < 256)
		snprintf(used[nused++], sizeof used[0], "%s", name);
	f->name = name;
	f->n = 0;
	FILE *fp = fopen(path, "r");
	check_count++;
	if (!fp) {
		fail(name, "%s", strerror(errno));
		return false;
	}
	char line[512];
	bool ok = true;
	for (int no = 1; ok && fgets(line, sizeof line, fp); no++) {
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		for (char *tok = strtok(line, " \t\r\n"); tok && ok; tok = strtok(NULL, " \t\r\n")) {
			unsigned v;
			int used_chars = 0;
			if (strlen(tok) != 2 || sscanf(tok, "%2x%n", &v, &used_chars) != 1 || used_chars != 2 || f->n == sizeof f->b) {
				fail(name, "line %d: %s is not a byte in two hex digits, or the message is over %zu bytes", no, tok, sizeof f->b);
				ok = false;
			} else
				f->b[f->n++] = (uint8_t)v;
		}
	}
	fclose(fp);
	return ok;
}

/* ---- messages libuvm sends ---- */

struct out {
	uint8_t buf[UVM_LAUNCH_MESSAGE_MAX];
	struct uvm_msg m;
};

static struct uvm_msg *out_start(struct out *o)
{
	o->m = (struct uvm_msg){.buf = o->buf, .cap = sizeof o->buf};
	return &o->m;
}

/* expect_sent checks that libuvm encodes the fixture's message as m,
 * byte for byte. */
static void expect_sent(const char *name, const struct uvm_msg *m)
{
	struct fixture f;
	if (!load(name, &f))
		return;
	check_count++;
	if (m->overflow) {
		fail(name, "libuvm's encoding overflows its %zu-byte buffer", m->cap);
		return;
	}
	if (m->len == f.n && memcmp(m->buf, f.b, f.n) == 0)
		return;
	size_t i = 0;
	while (i < m->len && i < f.n && m->buf[i] == f.b[i])
		i++;
	char got[16] = "the end", want[16] = "the end";
	if (i < m->len)
		snprintf(got, sizeof got, "0x%02x", m->buf[i]);
	if (i < f.n)
		snprintf(want, sizeof want, "0x%02x", f.b[i]);
	fail(name, "libuvm writes %s at byte %zu, the fixture %s (%zu bytes encoded, %zu in the fixture)", got, i, want, m->len, f.n);
}

static void test_sent(void)
{
	struct out o;
	struct uvm_msg *m;

	uvm__encode_hello(m = out_start(&o), 1, 4242, UVM_COHERENCE_LAUNCH);
	expect_sent("hello-request", m);
	uvm__encode_alloc(m = out_start(&o), 2, ADDR, 0x3000, 12032, uvmMemAttachHost, UVM_KIND_DEVICE, 1);
	expect_sent("alloc-request", m);
	uvm__encode_free(m = out_start(&o), 3, ADDR);
	expect_sent("free-request", m);
	uvm__encode_prefetch(m = out_start(&o), 4, ADDR, UVM_BLOCK_SIZE, uvmCpuDeviceId);
	expect_sent("prefetch-request", m);
	uvm__encode_range_attrs(m = out_start(&o), 5, ADDR, UVM_BLOCK_SIZE);
	expect_sent("range-attributes-request", m);
	uvm__encode_discard(m = out_start(&o), 33, ADDR, UVM_BLOCK_SIZE);
	expect_sent("discard-request", m);
	uvm__encode_processor(m = out_start(&o), UVM_MSG_DEVICE_CONNECT, 8, 1);
	expect_sent("device-connect-request", m);
	uvm__encode_device_hello(m = out_start(&o), 1, 1, 4243);
	expect_sent("device-hello-request", m);
	uvm__msg_start(m = out_start(&o), UVM_MSG_DEVICE_READY, 2, 0);
	expect_sent("device-ready-request", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_DEVICE_MAP, 11, UVM_WIRE_OK, NULL);
	expect_sent("device-map-reply", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_DEVICE_MAP, 11, UVM_WIRE_INVALID_VALUE, "map device 3: this session has 2 devices");
	expect_sent("device-map-error", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_DEVICE_UNMAP, 12, UVM_WIRE_OK, NULL);
	expect_sent("device-unmap-reply", m);
	static const uint8_t params[] = {1, 2, 3, 4, 5};
	uvm__encode_launch(m = out_start(&o), 13, 2, 64, 0x401000, params, sizeof params, 1);
	expect_sent("launch-request", m);
	uvm__encode_trace_control(m = out_start(&o), 34, UVM_TRACE_START, "/tmp/prog.uvmtrace");
	expect_sent("trace-control-request", m);
	uvm__encode_launch_grid(m = out_start(&o), 15, 2, (uvmDim3){40, 3, 1}, (uvmDim3){16, 8, 2}, 4096, 1 << 20, UVM_GRID_COOPERATIVE, 0x401000,
				params, sizeof params, -1);
	expect_sent("launch-grid-request", m);
	struct uvm_crash crash = {.kernel = 0x401000, .stream = 2, .tid = 17, .nthreads = 64, .sig = 11, .code = 1, .addr = 0x10,
				  .block = 5, .grid_dim = {8, 1, 1}, .block_dim = {64, 1, 1}};
	uvm__encode_crash(m = out_start(&o), &crash);
	expect_sent("launch-crash", m);
	uvm__encode_stream(m = out_start(&o), UVM_MSG_SYNC, 14, 2);
	expect_sent("sync-request", m);
	uvm__encode_stream_attach(m = out_start(&o), 30, ADDR, uvmMemAttachSingle, 1, 3);
	expect_sent("stream-attach-request", m);
	uvm__encode_launch_begin(m = out_start(&o), 31, 1, 3, "c:0x401000");
	expect_sent("launch-begin-request", m);
	uvm__encode_streams_idle(m = out_start(&o), 32, 1, UVM_ALL_STREAMS);
	expect_sent("streams-idle-request", m);
	/* A stream answers with its errors since the last synchronize:
	 * none, an empty string under an OK status. */
	uvm__encode_reply(m = out_start(&o), UVM_MSG_SYNC, 14, UVM_WIRE_OK, "");
	expect_sent("sync-reply", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_SYNC, 14, UVM_WIRE_LAUNCH_FAILURE,
			  "device 1: kernel c:0x401000 is not a C kernel (want c:0x<address>)");
	expect_sent("sync-error", m);
	uvm__encode_stream(m = out_start(&o), UVM_MSG_STREAM_DESTROY, 15, 2);
	expect_sent("stream-destroy-request", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_DEVICE_UP, 0, UVM_WIRE_OK, NULL);
	expect_sent("device-up", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_DEVICE_UP, 0, UVM_WIRE_INITIALIZATION, "userfaultfd: Operation not permitted");
	expect_sent("device-up-error", m);
	uvm__encode_advise(m = out_start(&o), 17, ADDR, UVM_BLOCK_SIZE, (uint8_t)uvmMemAdviseSetAccessedBy, 1);
	expect_sent("advise-request", m);
	uvm__encode_device_written(m = out_start(&o), 18, ADDR, 100);
	expect_sent("device-copy-request", m);
	uvm__encode_stream(m = out_start(&o), UVM_MSG_STREAM_OPEN, 19, 3);
	expect_sent("stream-open-request", m);
	uvm__encode_processor(m = out_start(&o), UVM_MSG_DEVICE_FILE, 20, 1);
	expect_sent("device-file-request", m);
	uvm__encode_reply(m = out_start(&o), UVM_MSG_DEVICE_HINTS, 21, UVM_WIRE_OK, NULL);
	expect_sent("device-hints-reply", m);
	uvm__encode_peer_access(m = out_start(&o), 33, 1, 0, true, 0); /* props.c */
	expect_sent("peer-access-request", m);
	/* devproc.c report_add, report_send_locked: a launch and a
	 * synchronization, three records lost before them. */
	static uint8_t report[UVM_REPORT_MESSAGE_MAX];
	struct uvm_msg rm = {.buf = report, .cap = sizeof report};
	uvm__report_start(&rm);
	uvm__report_add(&rm, UVM_REPORT_LAUNCH, 2, 64, 5000000000ull, 5000250000ull, (const uint8_t *)"c:0x401000", 10);
	uvm__report_add(&rm, UVM_REPORT_SYNC, 2, 0, 5000300000ull, 5000301500ull, (const uint8_t *)"", 0);
	uvm__report_finish(&rm, 3, 2);
	expect_sent("device-report", &rm);

	/* A reply's message is cut to its buffer, never past it. */
	uint8_t small[UVM_WIRE_HEADER + 4 + 5];
	struct uvm_msg sm = {.buf = small, .cap = sizeof small};
	uvm__encode_reply(&sm, UVM_MSG_SYNC, 14, UVM_WIRE_LAUNCH_FAILURE, "device 1: a long message");
	CHECK(!sm.overflow && sm.len == sizeof small && memcmp(small + UVM_WIRE_HEADER + 4, "devic", 5) == 0);
}

/* ---- messages libuvm reads ---- */

#define EXPECT(f, what, got, want)                                                                           \
	do {                                                                                                 \
		long long g_ = (long long)(got), w_ = (long long)(want);                                     \
		check_count++;                                                                               \
		if (g_ != w_)                                                                                \
			fail((f)->name, "%s is %lld (%#llx), want %lld (%#llx) (wire_golden_test.c:%d)", what, \
			     g_, (unsigned long long)g_, w_, (unsigned long long)w_, __LINE__);                \
	} while (0)

/* open_msg loads a fixture and parses its header as libuvm does, checking
 * its type, sequence and status; r gets the payload. */
static bool open_msg(const char *name, struct fixture *f, struct uvm_reader *r, uint16_t type, uint32_t seq, uint32_t status)
{
	struct uvm_header h;
	if (!load(name, f))
		return false;
	check_count++;
	if (!uvm__parse_header(f->b, f->n, &h, r)) {
		fail(name, "uvm__parse_header refuses it");
		return false;
	}
	EXPECT(f, "the type", h.type, type);
	EXPECT(f, "the sequence", h.seq, seq);
	EXPECT(f, "the status", h.status, status);
	return true;
}

static void expect_str(const struct fixture *f, const char *what, struct uvm_reader *r, const char *want)
{
	uint32_t len;
	const uint8_t *p = uvm__get_bytes(r, &len);
	check_count++;
	if (!p || len != strlen(want) || memcmp(p, want, len) != 0)
		fail(f->name, "%s is \"%.*s\", want \"%s\"", what, p ? (int)len : 0, p ? (const char *)p : "", want);
}

/* expect_end checks that the payload was read whole, nothing short. */
static void expect_end(const struct fixture *f, const struct uvm_reader *r)
{
	check_count++;
	if (r->err || r->n != 0)
		fail(f->name, "%s", r->err ? "the payload is shorter than libuvm reads" : "bytes are left over after what libuvm reads");
}

/* expect_empty checks a reply libuvm reads only the header of. */
static void expect_empty(const char *name, uint16_t type, uint32_t seq)
{
	struct fixture f;
	struct uvm_reader r;
	if (open_msg(name, &f, &r, type, seq, UVM_WIRE_OK))
		expect_end(&f, &r);
}

/* expect_error checks an error reply: its status, the library's error
 * code for it, and its message. */
static void expect_error(const char *name, uint16_t type, uint32_t seq, uint32_t status, uvmError_t code, const char *msg)
{
	struct fixture f;
	struct uvm_reader r;
	if (!open_msg(name, &f, &r, type, seq, status))
		return;
	EXPECT(&f, "the error code", uvm__from_wire(status), code);
	expect_str(&f, "the message", &r, msg);
	expect_end(&f, &r);
}

static void test_read(void)
{
	struct fixture f;
	struct uvm_reader r;

	if (open_msg("hello-reply", &f, &r, UVM_MSG_HELLO, 1, UVM_WIRE_OK)) {
		EXPECT(&f, "the server pid", uvm__get_u32(&r), 4244);
		EXPECT(&f, "the session", uvm__get_u64(&r), 9);
		EXPECT(&f, "the features", uvm__get_u64(&r), 0x1a2);
		EXPECT(&f, "the device count", uvm__get_u32(&r), 2);
		EXPECT(&f, "device 0's capacity", uvm__get_u64(&r), 64ul << 20);
		expect_str(&f, "device 0's backend", &r, "memfd");
		EXPECT(&f, "device 0's node", uvm__get_i32(&r), -1);
		EXPECT(&f, "device 0's workers", uvm__get_u32(&r), 2);
		EXPECT(&f, "device 1's capacity", uvm__get_u64(&r), 128ul << 20);
		expect_str(&f, "device 1's backend", &r, "numa");
		EXPECT(&f, "device 1's node", uvm__get_i32(&r), 0);
		EXPECT(&f, "device 1's workers", uvm__get_u32(&r), 4);
		EXPECT(&f, "the coherence model", uvm__get_u8(&r), UVM_COHERENCE_FAULT);
		expect_end(&f, &r);
	}
	if (open_msg("alloc-reply", &f, &r, UVM_MSG_ALLOC, 2, UVM_WIRE_OK)) {
		EXPECT(&f, "the buffer id", uvm__get_u64(&r), 77);
		expect_end(&f, &r);
	}
	expect_error("alloc-error", UVM_MSG_ALLOC, 2, UVM_WIRE_MEMORY_ALLOCATION, uvmErrorMemoryAllocation,
		     "device 1's arena is full: 12032 bytes wanted, 4096 free");
	expect_empty("free-reply", UVM_MSG_FREE, 3);
	expect_empty("prefetch-reply", UVM_MSG_PREFETCH, 4);
	expect_empty("discard-reply", UVM_MSG_DISCARD, 33);
	if (open_msg("range-attributes-reply", &f, &r, UVM_MSG_RANGE_ATTRIBUTES, 5, UVM_WIRE_OK)) {
		EXPECT(&f, "read-mostly", uvm__get_u8(&r), 1);
		EXPECT(&f, "the preferred location", uvm__get_i32(&r), 1);
		EXPECT(&f, "the last prefetch location", uvm__get_i32(&r), uvmInvalidDeviceId);
		EXPECT(&f, "the accessed-by count", uvm__get_u32(&r), 2);
		EXPECT(&f, "accessed by 0", uvm__get_i32(&r), uvmCpuDeviceId);
		EXPECT(&f, "accessed by 1", uvm__get_i32(&r), 1);
		expect_end(&f, &r);
	}
	expect_empty("device-connect-reply", UVM_MSG_DEVICE_CONNECT, 8);
	if (open_msg("device-hello-reply", &f, &r, UVM_MSG_DEVICE_HELLO, 1, UVM_WIRE_OK)) {
		EXPECT(&f, "the run count", uvm__get_u32(&r), 2);
		EXPECT(&f, "run 0's address", uvm__get_u64(&r), ADDR);
		EXPECT(&f, "run 0's length", uvm__get_u64(&r), UVM_BLOCK_SIZE);
		EXPECT(&f, "run 0's file", uvm__get_i32(&r), 1);
		EXPECT(&f, "run 1's address", uvm__get_u64(&r), ADDR2);
		EXPECT(&f, "run 1's length", uvm__get_u64(&r), 2 * UVM_PAGE_SIZE);
		EXPECT(&f, "run 1's file", uvm__get_i32(&r), UVM_CPU);
		EXPECT(&f, "minor remote", uvm__get_u8(&r), 1);
		EXPECT(&f, "minor own", uvm__get_u8(&r), 1);
		EXPECT(&f, "the runs to follow", uvm__get_u32(&r), 1);
		expect_end(&f, &r);
	}
	if (open_msg("device-layout-request", &f, &r, UVM_MSG_DEVICE_LAYOUT, 1, 0)) {
		EXPECT(&f, "the run count", uvm__get_u32(&r), 1);
		EXPECT(&f, "run 0's address", uvm__get_u64(&r), ADDR2 + UVM_BLOCK_SIZE);
		EXPECT(&f, "run 0's length", uvm__get_u64(&r), UVM_PAGE_SIZE);
		EXPECT(&f, "run 0's file", uvm__get_i32(&r), 0);
		expect_end(&f, &r);
	}
	expect_empty("device-ready-reply", UVM_MSG_DEVICE_READY, 2);
	if (open_msg("device-map-request", &f, &r, UVM_MSG_DEVICE_MAP, 11, 0)) {
		EXPECT(&f, "the address", uvm__get_u64(&r), ADDR2);
		EXPECT(&f, "the length", uvm__get_u64(&r), UVM_BLOCK_SIZE);
		EXPECT(&f, "the file", uvm__get_i32(&r), 1);
		for (int i = 0; i < UVM_PAGE_MASK_WORDS; i++) {
			char what[32];
			snprintf(what, sizeof what, "write-protect word %d", i);
			EXPECT(&f, what, uvm__get_u64(&r), i == 0 ? 0x5 : i == 7 ? 1ull << 63 : 0);
		}
		expect_end(&f, &r);
	}
	if (open_msg("device-unmap-request", &f, &r, UVM_MSG_DEVICE_UNMAP, 12, 0)) {
		EXPECT(&f, "the address", uvm__get_u64(&r), ADDR);
		EXPECT(&f, "the length", uvm__get_u64(&r), UVM_BLOCK_SIZE);
		expect_end(&f, &r);
	}
	if (open_msg("launch-request", &f, &r, UVM_MSG_LAUNCH, 13, 0)) {
		EXPECT(&f, "the stream", uvm__get_u32(&r), 2);
		EXPECT(&f, "the thread count", uvm__get_u32(&r), 64);
		expect_str(&f, "the kernel name", &r, "c:0x401000");
		uint32_t n;
		const uint8_t *p = uvm__get_bytes(&r, &n);
		check_count++;
		if (!p || n != 5 || memcmp(p, "\1\2\3\4\5", 5) != 0)
			fail(f.name, "the parameters are not 01 02 03 04 05 (%u bytes)", n);
		EXPECT(&f, "the cpu", uvm__get_i32(&r), 1);
		expect_end(&f, &r);
	}
	if (open_msg("launch-grid-request", &f, &r, UVM_MSG_LAUNCH_GRID, 15, 0)) {
		struct uvm_launch_grid lg;
		check_count++;
		if (!uvm__decode_launch_grid(&r, &lg))
			fail(f.name, "uvm__decode_launch_grid refuses it");
		EXPECT(&f, "the stream", lg.stream, 2);
		EXPECT(&f, "grid x", lg.grid.x, 40);
		EXPECT(&f, "grid y", lg.grid.y, 3);
		EXPECT(&f, "grid z", lg.grid.z, 1);
		EXPECT(&f, "block x", lg.block.x, 16);
		EXPECT(&f, "block y", lg.block.y, 8);
		EXPECT(&f, "block z", lg.block.z, 2);
		EXPECT(&f, "the shared memory", lg.shared, 4096);
		EXPECT(&f, "the stack size", lg.stack, 1 << 20);
		EXPECT(&f, "the flags", lg.flags, UVM_GRID_COOPERATIVE);
		check_count++;
		if (lg.name_len != 10 || memcmp(lg.name, "c:0x401000", 10) != 0)
			fail(f.name, "the kernel name is not c:0x401000");
		check_count++;
		if (lg.params_len != 5 || memcmp(lg.params, "\1\2\3\4\5", 5) != 0)
			fail(f.name, "the parameters are not 01 02 03 04 05 (%u bytes)", lg.params_len);
		EXPECT(&f, "the cpu", lg.cpu, -1);
	}
	if (open_msg("launch-crash", &f, &r, UVM_MSG_LAUNCH, 0, UVM_WIRE_LAUNCH_FAILURE)) {
		struct uvm_crash c;
		check_count++;
		if (!uvm__decode_crash(&r, &c))
			fail(f.name, "uvm__decode_crash refuses it");
		EXPECT(&f, "the kernel", c.kernel, 0x401000);
		EXPECT(&f, "the stream", c.stream, 2);
		EXPECT(&f, "the thread", c.tid, 17);
		EXPECT(&f, "the thread count", c.nthreads, 64);
		EXPECT(&f, "the signal", c.sig, 11);
		EXPECT(&f, "si_code", c.code, 1);
		EXPECT(&f, "the address", c.addr, 0x10);
		EXPECT(&f, "the block", c.block, 5);
		EXPECT(&f, "grid x", c.grid_dim.x, 8);
		EXPECT(&f, "grid y", c.grid_dim.y, 1);
		EXPECT(&f, "grid z", c.grid_dim.z, 1);
		EXPECT(&f, "block x", c.block_dim.x, 64);
		EXPECT(&f, "block y", c.block_dim.y, 1);
		EXPECT(&f, "block z", c.block_dim.z, 1);
	}
	/* A device process reads a synchronize's and a stream-destroy's type
	 * and sequence only; the stream is the socket's. */
	if (open_msg("sync-request", &f, &r, UVM_MSG_SYNC, 14, 0)) {
		EXPECT(&f, "the stream", uvm__get_u32(&r), 2);
		expect_end(&f, &r);
	}
	expect_empty("sync-reply", UVM_MSG_SYNC, 14);
	expect_empty("stream-attach-reply", UVM_MSG_STREAM_ATTACH, 30); /* coherence.c uvmStreamAttachMemAsync */
	expect_empty("launch-begin-reply", UVM_MSG_LAUNCH_BEGIN, 31);   /* coherence.c uvm__coherence_before_launch */
	expect_empty("streams-idle-reply", UVM_MSG_STREAMS_IDLE, 32);   /* coherence.c uvm__coherence_after_sync */
	expect_empty("trace-control-reply", UVM_MSG_TRACE_CONTROL, 34); /* profiler.c */
	expect_error("sync-error", UVM_MSG_SYNC, 14, UVM_WIRE_LAUNCH_FAILURE, uvmErrorLaunchFailure,
		     "device 1: kernel c:0x401000 is not a C kernel (want c:0x<address>)");
	if (open_msg("stream-destroy-request", &f, &r, UVM_MSG_STREAM_DESTROY, 15, 0)) {
		EXPECT(&f, "the stream", uvm__get_u32(&r), 2);
		expect_end(&f, &r);
	}
	expect_empty("device-up", UVM_MSG_DEVICE_UP, 0);
	expect_error("device-up-error", UVM_MSG_DEVICE_UP, 0, UVM_WIRE_INITIALIZATION, uvmErrorInitializationError,
		     "userfaultfd: Operation not permitted");
	expect_empty("advise-reply", UVM_MSG_ADVISE, 17);
	expect_empty("device-copy-reply", UVM_MSG_DEVICE_COPY, 18);
	if (open_msg("stream-open-request", &f, &r, UVM_MSG_STREAM_OPEN, 19, 0)) {
		EXPECT(&f, "the stream", uvm__get_u32(&r), 3);
		expect_end(&f, &r);
	}
	if (open_msg("device-file-reply", &f, &r, UVM_MSG_DEVICE_FILE, 20, UVM_WIRE_OK)) {
		EXPECT(&f, "the copy producers", uvm__get_u64(&r), 2);
		EXPECT(&f, "non-temporal above", uvm__get_u64(&r), 1 << 20);
		EXPECT(&f, "direct below", uvm__get_u64(&r), 64 << 10);
		expect_end(&f, &r);
	}
	if (open_msg("device-hints-request", &f, &r, UVM_MSG_DEVICE_HINTS, 21, 0)) {
		EXPECT(&f, "the run count", uvm__get_u32(&r), 2);
		EXPECT(&f, "run 0's address", uvm__get_u64(&r), ADDR);
		EXPECT(&f, "run 0's length", uvm__get_u64(&r), 2 * UVM_PAGE_SIZE);
		EXPECT(&f, "run 1's address", uvm__get_u64(&r), ADDR2);
		EXPECT(&f, "run 1's length", uvm__get_u64(&r), UVM_PAGE_SIZE);
		expect_end(&f, &r);
	}
	if (open_msg("restarted", &f, &r, UVM_MSG_RESTARTED, 0, 0)) {
		EXPECT(&f, "the server pid", uvm__get_u32(&r), 4245);
		EXPECT(&f, "the restarts", uvm__get_u32(&r), 2);
		expect_end(&f, &r);
	}
	if (open_msg("device-trace", &f, &r, UVM_MSG_DEVICE_TRACE, 0, 0)) { /* devproc.c attach */
		EXPECT(&f, "the flags", uvm__get_u32(&r), UVM_TRACE_LAUNCHES);
		expect_end(&f, &r);
	}
	if (open_msg("peer-access-reply", &f, &r, UVM_MSG_PEER_ACCESS, 33, UVM_WIRE_OK)) { /* props.c peer_access */
		EXPECT(&f, "was enabled", uvm__get_u8(&r), 0);
		expect_end(&f, &r);
	}
}

/* test_all_known fails on a fixture this file neither checks nor lists in
 * go_only: a new message form must be placed. */
static void test_all_known(void)
{
	DIR *d = opendir(dir);
	check_count++;
	if (!d) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		check_failures++;
		return;
	}
	int nfiles = 0;
	for (struct dirent *e; (e = readdir(d));) {
		size_t len = strlen(e->d_name);
		if (len < 5 || strcmp(e->d_name + len - 4, ".hex") != 0)
			continue;
		nfiles++;
		bool known = false;
		for (int i = 0; i < nused && !known; i++)
			known = strlen(used[i]) == len - 4 && strncmp(used[i], e->d_name, len - 4) == 0;
		for (size_t i = 0; i < sizeof go_only / sizeof go_only[0] && !known; i++)
			known = strlen(go_only[i]) == len - 4 && strncmp(go_only[i], e->d_name, len - 4) == 0;
		check_count++;
		if (!known) {
			fprintf(stderr, "%s/%s: a message form libuvm's test does not know: check it here, or list it in go_only\n", dir, e->d_name);
			check_failures++;
		}
	}
	closedir(d);
	check_count++;
	if (nfiles == 0) {
		fprintf(stderr, "%s: no fixtures\n", dir);
		check_failures++;
	}
}

int main(int argc, char **argv)
{
	dir = argc > 1 ? argv[1] : getenv("UVM_GOLDEN_DIR");
	if (!dir || !*dir)
		dir = "../internal/wire/testdata/golden";
	test_sent();
	test_read();
	test_all_known();
	return check_done("wire_golden_test");
}
