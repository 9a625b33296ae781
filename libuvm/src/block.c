/*
 * block.c: how a device process runs a grid launch's blocks: their
 * threads, their barriers, their shared memory, and a cooperative grid's
 * barrier (devproc.c hands it the launch and the workers).
 *
 * A block runs on one OS thread, the way CPU runtimes of CUDA and HIP run
 * one (HIP-CPU, CuPBoP, POCL): its threads take turns, and the block's
 * shared memory is the thread's. The block's first thread runs on the
 * thread's own stack; if it returns without waiting at a barrier, the
 * next one runs, and so on: a block whose kernel has no barrier is a
 * plain loop over its threads (HIP-CPU's trick). The first thread that
 * waits at a barrier while others are still to come turns the rest of
 * the block into fibers (fiber.c), one per thread still to run, each on a
 * stack of its own; from then on a thread that waits switches to the next
 * that can run, and the last to arrive releases the others, who run in
 * turn. A block of any size runs on one worker, however many threads wait
 * for each other, and a barrier costs one switch per waiting thread.
 *
 * A thread that has returned no longer counts at a barrier: the threads
 * still running wait for each other only. CUDA leaves a barrier that some
 * threads never reach undefined; here it neither deadlocks nor waits for
 * the dead.
 *
 * Shared memory: the dynamic part is a buffer of the OS thread running
 * the block (uvmDynamicShared); the static part (uvm_cuda.h's
 * __shared__) is thread-local storage, which every thread of a block
 * shares because they all run on one OS thread, and no other block
 * shares because a worker runs its blocks one after another.
 *
 * A cooperative launch runs each block on an OS thread of its own,
 * created for the launch (devproc.c), so that every block is resident at
 * once; uvmGridSync is a block barrier whose last arrival waits, before
 * it releases its block, until every block still running has arrived.
 *
 * Nothing here takes a lock but a cooperative grid's mutex, a leaf.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

__thread uvmGridCoords uvm__coords;

/* What the calling thread runs, for devproc.c's crash handler: set here
 * for grids and there for launches of threads. */
__thread struct uvm_running uvm__running;

/* One thread of a block, as a fiber. */
struct block_thread {
	struct uvm_fiber ctx;
	struct block_thread *next; /* in the run queue or the barrier's list */
	unsigned tid;              /* linear index in the block */
	uvmDim3 idx;
};

/* What an OS thread that runs blocks keeps from one block to the next:
 * the fibers and their stacks, the dynamic shared memory. */
struct runner {
	struct block_thread *threads; /* UVM_MAX_THREADS_PER_BLOCK, stacks made on first use */
	size_t stack;                 /* the size every stack in threads has */
	uint8_t *shared;              /* UVM_MAX_SHARED_MEMORY_PER_BLOCK bytes */
};

/* The block the calling OS thread runs, and its state. */
struct block {
	struct uvm_grid *g;
	uint64_t index; /* linear */
	unsigned alive;   /* threads that have not returned */
	unsigned arrived; /* threads waiting at the barrier */
	unsigned count;   /* of them, how many passed a true predicate */
	unsigned result_count, result_n; /* at the last barrier's release */
	bool fibers;     /* the rest of the block runs as fibers */
	bool grid_wait;  /* the barrier is a grid barrier's */
	struct block_thread *cur;
	struct block_thread native; /* the thread on the OS thread's own stack */
	struct block_thread *runq, *runq_tail;
	struct block_thread *waiting, *waiting_tail;
	struct uvm_fiber end; /* the OS thread's own stack, waiting for the fibers once its thread returned */
	struct runner *r;
};

static __thread struct runner *runner;
static __thread struct block *cur_block;

static void misuse(const char *fn, const char *why) __attribute__((noreturn));
static void misuse(const char *fn, const char *why)
{
	fprintf(stderr, "softuvm: %s %s\n", fn, why);
	fflush(stderr);
	abort(); /* in a device process, a crash the next synchronize reports */
}

static struct runner *runner_get(void)
{
	if (runner)
		return runner;
	struct runner *r = uvm__sys_calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->threads = uvm__sys_mmap(NULL, UVM_MAX_THREADS_PER_BLOCK * sizeof *r->threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	r->shared = uvm__sys_mmap(NULL, UVM_MAX_SHARED_MEMORY_PER_BLOCK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->threads == MAP_FAILED || r->shared == MAP_FAILED) {
		if (r->threads != MAP_FAILED)
			uvm__sys_munmap(r->threads, UVM_MAX_THREADS_PER_BLOCK * sizeof *r->threads);
		if (r->shared != MAP_FAILED)
			uvm__sys_munmap(r->shared, UVM_MAX_SHARED_MEMORY_PER_BLOCK);
		uvm__sys_free(r);
		return NULL;
	}
	return runner = r;
}

void uvm__grid_thread_end(void)
{
	struct runner *r = runner;
	if (!r)
		return;
	for (unsigned i = 0; i < UVM_MAX_THREADS_PER_BLOCK; i++)
		uvm__fiber_free_stack(&r->threads[i].ctx);
	uvm__sys_munmap(r->threads, UVM_MAX_THREADS_PER_BLOCK * sizeof *r->threads);
	uvm__sys_munmap(r->shared, UVM_MAX_SHARED_MEMORY_PER_BLOCK);
	uvm__sys_free(r);
	runner = NULL;
}

static inline uvmDim3 index_in(uint64_t linear, uvmDim3 dim)
{
	return (uvmDim3){.x = (unsigned)(linear % dim.x), .y = (unsigned)(linear / dim.x % dim.y), .z = (unsigned)(linear / ((uint64_t)dim.x * dim.y))};
}

/* become makes t the running thread: its coordinates, and what the crash
 * handler names. */
static inline void become(struct block *b, struct block_thread *t)
{
	b->cur = t;
	uvm__coords.threadIdx = t->idx;
	uvm__running.tid = t->tid;
}

static void runq_push(struct block *b, struct block_thread *t)
{
	t->next = NULL;
	if (b->runq_tail)
		b->runq_tail->next = t;
	else
		b->runq = t;
	b->runq_tail = t;
}

static struct block_thread *runq_pop(struct block *b)
{
	struct block_thread *t = b->runq;
	b->runq = t->next;
	if (!b->runq)
		b->runq_tail = NULL;
	return t;
}

/* release ends a barrier: its result, and its waiters runnable again, in
 * the order they arrived. The caller goes on running. */
static void release(struct block *b)
{
	b->result_count = b->count;
	b->result_n = b->arrived;
	b->count = 0;
	b->arrived = 0;
	if (b->grid_wait) {
		b->grid_wait = false;
		uvm__grid_barrier(b->g);
	}
	if (b->waiting) {
		if (b->runq_tail)
			b->runq_tail->next = b->waiting;
		else
			b->runq = b->waiting;
		b->runq_tail = b->waiting_tail;
		b->waiting = b->waiting_tail = NULL;
	}
}

/* switch_from saves the running thread t and resumes the next runnable
 * one: there is one whenever t waits or ends while others live (each
 * living thread is running, runnable or waiting, and a barrier every
 * living thread reached has been released). */
static void switch_from(struct block *b, struct uvm_fiber *save)
{
	struct block_thread *next = runq_pop(b);
	become(b, next);
	uvm__fiber_switch(save, &next->ctx);
}

static void fiber_main(void *arg);

/* start_fibers makes fibers of the threads after the running one (which
 * runs on the OS thread's own stack): none of them has started yet. */
static void start_fibers(struct block *b)
{
	struct runner *r = b->r;
	struct uvm_grid *g = b->g;
	size_t stack = g->stack ? g->stack : UVM_DEFAULT_STACK_SIZE;
	for (unsigned t = b->native.tid + 1; t < g->threads; t++) {
		struct block_thread *f = &r->threads[t];
		int e = uvm__fiber_stack(&f->ctx, stack);
		if (e) {
			fprintf(stderr, "softuvm device %d: no memory for the stack of thread %u of a block of %u: %s\n", g->device, t,
				g->threads, strerror(e));
			fflush(stderr);
			abort();
		}
		f->tid = t;
		f->idx = index_in(t, g->block);
		uvm__fiber_make(&f->ctx, fiber_main, f);
		runq_push(b, f);
	}
	b->fibers = true;
}

/* barrier waits until every living thread of the block has arrived. */
static void barrier(struct block *b, int pred)
{
	if (pred)
		b->count++;
	if (++b->arrived == b->alive) {
		release(b);
		return;
	}
	if (!b->fibers)
		start_fibers(b);
	struct block_thread *me = b->cur;
	me->next = NULL;
	if (b->waiting_tail)
		b->waiting_tail->next = me;
	else
		b->waiting = me;
	b->waiting_tail = me;
	switch_from(b, &me->ctx);
}

/* thread_ended counts a returned thread out; a barrier that only it kept
 * from completing completes. */
static void thread_ended(struct block *b)
{
	b->alive--;
	if (b->alive > 0 && b->arrived == b->alive)
		release(b);
}

static void fiber_main(void *arg)
{
	struct block_thread *t = arg;
	struct block *b = cur_block;
	(void)t;
	b->g->fn(b->g->params);
	thread_ended(b);
	struct block_thread *me = b->cur;
	if (b->alive == 0) {
		/* The last: back to the OS thread's stack, where the first
		 * thread returned and waits. */
		uvm__fiber_switch(&me->ctx, &b->end);
	} else
		switch_from(b, &me->ctx);
	__builtin_unreachable();
}

/* run_block runs block index of g on the calling OS thread. */
static void run_block(struct uvm_grid *g, struct runner *r, uint64_t index)
{
	struct block b = {.g = g, .index = index, .alive = g->threads, .r = r};
	cur_block = &b;
	uvm__running.block = index;
	uvm__coords.blockIdx = index_in(index, g->grid);
	uvm__coords.blockDim = g->block;
	uvm__coords.gridDim = g->grid;
	uvmDim3 idx = {0, 0, 0};
	for (unsigned t = 0; t < g->threads; t++) {
		b.native.tid = t;
		b.native.idx = idx;
		if (++idx.x == g->block.x) {
			idx.x = 0;
			if (++idx.y == g->block.y) {
				idx.y = 0;
				idx.z++;
			}
		}
		become(&b, &b.native);
		g->fn(g->params);
		if (b.fibers) {
			/* This thread waited at a barrier: the threads after it
			 * are fibers, which run to their end before the block's. */
			thread_ended(&b);
			if (b.alive > 0)
				switch_from(&b, &b.end);
			break;
		}
		b.alive--;
	}
	cur_block = NULL;
	if (g->cooperative)
		uvm__grid_block_done(g);
}

/* running_grid tells the crash handler which grid the thread runs. */
static void running_grid(const struct uvm_grid *g)
{
	uvm__running.kernel = g->kernel;
	uvm__running.stream = g->stream;
	uvm__running.nthreads = g->threads;
	uvm__running.grid_dim = g->grid;
	uvm__running.block_dim = g->block;
	uvm__running.active = true;
}

const char *uvm__grid_work(struct uvm_grid *g)
{
	struct runner *r = runner_get();
	if (!r)
		return "no memory for a worker's block state";
	running_grid(g);
	for (;;) {
		uint64_t i = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED);
		if (i >= g->blocks)
			break;
		run_block(g, r, i);
	}
	uvm__running.active = false;
	return NULL;
}

const char *uvm__grid_run_block(struct uvm_grid *g, uint64_t index)
{
	struct runner *r = runner_get();
	if (!r) {
		uvm__grid_block_done(g);
		return "no memory for a block's state";
	}
	running_grid(g);
	run_block(g, r, index);
	uvm__running.active = false;
	return NULL;
}

/* ---- the shapes a device runs (grid.c checks them too, before a launch) ---- */

const char *uvm__grid_check(uvmDim3 grid, uvmDim3 block, uint64_t shared, uint64_t stack, char *msg, size_t cap)
{
	uint64_t threads = (uint64_t)block.x * block.y * block.z;
	const char *why = NULL;
	char limit[160];
	if (!grid.x || !grid.y || !grid.z)
		why = "a grid dimension is 0; want at least 1 block in each";
	else if (!block.x || !block.y || !block.z)
		why = "a block dimension is 0; want at least 1 thread in each";
	else if (grid.x > UVM_MAX_GRID_DIM_X || grid.y > UVM_MAX_GRID_DIM_Y || grid.z > UVM_MAX_GRID_DIM_Z) {
		snprintf(limit, sizeof limit, "want at most (%u,%u,%u) blocks", UVM_MAX_GRID_DIM_X, UVM_MAX_GRID_DIM_Y, UVM_MAX_GRID_DIM_Z);
		why = limit;
	} else if (block.x > UVM_MAX_BLOCK_DIM_X || block.y > UVM_MAX_BLOCK_DIM_Y || block.z > UVM_MAX_BLOCK_DIM_Z) {
		snprintf(limit, sizeof limit, "want at most (%u,%u,%u) threads in each dimension of a block", UVM_MAX_BLOCK_DIM_X, UVM_MAX_BLOCK_DIM_Y,
			 UVM_MAX_BLOCK_DIM_Z);
		why = limit;
	} else if (threads > UVM_MAX_THREADS_PER_BLOCK) {
		snprintf(limit, sizeof limit, "%llu threads in a block; want at most %u", (unsigned long long)threads, UVM_MAX_THREADS_PER_BLOCK);
		why = limit;
	} else if (shared > UVM_MAX_SHARED_MEMORY_PER_BLOCK) {
		snprintf(limit, sizeof limit, "want at most %u bytes of shared memory per block", UVM_MAX_SHARED_MEMORY_PER_BLOCK);
		why = limit;
	} else if (stack && (stack < UVM_MIN_STACK_SIZE || stack > UVM_MAX_STACK_SIZE)) {
		snprintf(limit, sizeof limit, "thread stacks of %llu bytes; want %u to %u", (unsigned long long)stack, UVM_MIN_STACK_SIZE,
			 UVM_MAX_STACK_SIZE);
		why = limit;
	}
	if (!why)
		return NULL;
	snprintf(msg, cap, "grid (%u,%u,%u) of blocks (%u,%u,%u) with %llu bytes of shared memory: %s", grid.x, grid.y, grid.z, block.x, block.y,
		 block.z, (unsigned long long)shared, why);
	return msg;
}

int uvm__max_active_blocks(uint64_t block_threads, uint64_t shared)
{
	if (block_threads == 0 || block_threads > UVM_MAX_THREADS_PER_BLOCK || shared > UVM_MAX_SHARED_MEMORY_PER_BLOCK)
		return 0;
	uint64_t n = UVM_MAX_THREADS_PER_MULTIPROCESSOR / block_threads;
	if (n > UVM_MAX_BLOCKS_PER_MULTIPROCESSOR)
		n = UVM_MAX_BLOCKS_PER_MULTIPROCESSOR;
	if (shared && UVM_SHARED_MEMORY_PER_MULTIPROCESSOR / shared < n)
		n = UVM_SHARED_MEMORY_PER_MULTIPROCESSOR / shared;
	return (int)n;
}

/* ---- a cooperative grid's barrier ---- */

void uvm__grid_barrier(struct uvm_grid *g)
{
	pthread_mutex_lock(&g->mu);
	uint64_t gen = g->gen;
	if (++g->arrived >= g->alive) {
		g->arrived = 0;
		g->gen++;
		pthread_cond_broadcast(&g->cv);
	} else {
		while (g->gen == gen)
			pthread_cond_wait(&g->cv, &g->mu);
	}
	pthread_mutex_unlock(&g->mu);
}

void uvm__grid_block_done(struct uvm_grid *g)
{
	pthread_mutex_lock(&g->mu);
	g->alive--;
	if (g->arrived > 0 && g->arrived >= g->alive) {
		g->arrived = 0;
		g->gen++;
		pthread_cond_broadcast(&g->cv);
	}
	pthread_mutex_unlock(&g->mu);
}

/* ---- the kernel's side (uvm.h) ---- */

static struct block *block_of(const char *fn)
{
	struct block *b = cur_block;
	if (!b)
		misuse(fn, "was called outside a thread of a grid kernel (one launched with uvmLaunchGrid or uvmLaunchCooperativeKernel)");
	return b;
}

void uvmSyncThreads(void) { barrier(block_of("uvmSyncThreads (__syncthreads)"), 0); }

int uvmSyncThreadsCount(int predicate)
{
	struct block *b = block_of("uvmSyncThreadsCount (__syncthreads_count)");
	barrier(b, predicate != 0);
	return (int)b->result_count;
}

int uvmSyncThreadsAnd(int predicate)
{
	struct block *b = block_of("uvmSyncThreadsAnd (__syncthreads_and)");
	barrier(b, predicate != 0);
	return b->result_count == b->result_n;
}

int uvmSyncThreadsOr(int predicate)
{
	struct block *b = block_of("uvmSyncThreadsOr (__syncthreads_or)");
	barrier(b, predicate != 0);
	return b->result_count > 0;
}

void uvmGridSync(void)
{
	struct block *b = block_of("uvmGridSync (grid.sync())");
	if (!b->g->cooperative)
		misuse("uvmGridSync (grid.sync())", "was called in a grid that is not cooperative: launch it with uvmLaunchCooperativeKernel, "
						    "which keeps every block resident so that a grid barrier can wait for all of them");
	b->grid_wait = true;
	barrier(b, 0);
}

void *uvmDynamicShared(void)
{
	struct block *b = cur_block;
	return b ? b->r->shared : NULL;
}
