/*
 * fiber.c: user-level contexts on stacks of their own, for the threads of
 * a block (block.c), which take turns on one worker thread and switch
 * only where a thread waits at a barrier.
 *
 * On x86-64 a switch is a dozen instructions: it saves the registers the
 * ABI says a callee keeps (rbx, rbp, r12-r15), the SSE control and status
 * word and the x87 control word on the stack it leaves, stores the stack
 * pointer, loads the other one and restores the same from there. No
 * system call: glibc's swapcontext saves and restores the signal mask
 * with one, which would cost more than the rest of a barrier. Elsewhere
 * ucontext does it (correct, slower).
 *
 * Each stack is mmap'ed with a guard page below it: a thread that
 * overflows its stack faults there, and the device process's crash
 * handler (on the thread's alternate signal stack) reports it as any
 * other kernel crash.
 */
#include "internal.h"

#include <errno.h>
#include <sys/mman.h>

#if defined(__x86_64__) && !defined(UVM_FIBER_UCONTEXT)

/* uvm__fiber_swap(save, sp): saves the running context on its stack, its
 * stack pointer in *save, and resumes the context whose stack pointer is
 * sp. uvm__fiber_start is where a new fiber starts: its stack holds r12
 * (the argument) and r13 (the function), which it calls; the function
 * never returns. */
__asm__(".text\n"
	".globl uvm__fiber_swap\n"
	".hidden uvm__fiber_swap\n"
	".type uvm__fiber_swap,@function\n"
	"uvm__fiber_swap:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size uvm__fiber_swap, .-uvm__fiber_swap\n"
	".globl uvm__fiber_start\n"
	".hidden uvm__fiber_start\n"
	".type uvm__fiber_start,@function\n"
	"uvm__fiber_start:\n"
	"	movq %r12, %rdi\n"
	"	callq *%r13\n"
	"	ud2\n"
	".size uvm__fiber_start, .-uvm__fiber_start\n");

UVM_HIDDEN void uvm__fiber_swap(void **save, void *sp);
UVM_HIDDEN void uvm__fiber_start(void);

void uvm__fiber_make(struct uvm_fiber *f, void (*entry)(void *), void *arg)
{
	/* The frame uvm__fiber_swap pops: the control words, r15, r14, r13
	 * (entry), r12 (arg), rbx, rbp, the return address. After the ret
	 * the stack pointer is the stack's top, 16-aligned, so that the call
	 * in uvm__fiber_start leaves it as the ABI wants at a function's
	 * entry. */
	uintptr_t top = ((uintptr_t)f->stack + f->size) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 8 * 8);
	uint32_t mxcsr;
	uint16_t fpucw;
	__asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
	__asm__ volatile("fnstcw %0" : "=m"(fpucw));
	sp[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
	sp[1] = 0;                   /* r15 */
	sp[2] = 0;                   /* r14 */
	sp[3] = (uint64_t)(uintptr_t)entry; /* r13 */
	sp[4] = (uint64_t)(uintptr_t)arg;   /* r12 */
	sp[5] = 0;                   /* rbx */
	sp[6] = 0;                   /* rbp: the end of a backtrace */
	sp[7] = (uint64_t)(uintptr_t)uvm__fiber_start;
	f->sp = sp;
}

void uvm__fiber_switch(struct uvm_fiber *from, struct uvm_fiber *to) { uvm__fiber_swap(&from->sp, to->sp); }

#else /* ucontext */

#include <ucontext.h>

/* makecontext passes ints: the pointer goes in two halves. */
static void fiber_trampoline(unsigned hi, unsigned lo)
{
	struct uvm_fiber *f = (struct uvm_fiber *)(((uintptr_t)hi << 32) | lo);
	f->entry(f->arg);
	__builtin_trap(); /* entry never returns */
}

void uvm__fiber_make(struct uvm_fiber *f, void (*entry)(void *), void *arg)
{
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->stack;
	f->uc.uc_stack.ss_size = f->size;
	f->uc.uc_link = NULL;
	f->entry = entry;
	f->arg = arg;
	uintptr_t p = (uintptr_t)f;
	makecontext(&f->uc, (void (*)(void))fiber_trampoline, 2, (unsigned)(p >> 32), (unsigned)p);
}

void uvm__fiber_switch(struct uvm_fiber *from, struct uvm_fiber *to) { swapcontext(&from->uc, &to->uc); }

#endif

int uvm__fiber_stack(struct uvm_fiber *f, size_t size)
{
	size = (size + UVM_PAGE_SIZE - 1) & ~(size_t)(UVM_PAGE_SIZE - 1);
	if (f->stack && f->size == size)
		return 0;
	uvm__fiber_free_stack(f);
	uint8_t *p = uvm__sys_mmap(NULL, size + UVM_PAGE_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
	if (p == MAP_FAILED)
		return errno;
	if (mprotect(p + UVM_PAGE_SIZE, size, PROT_READ | PROT_WRITE) < 0) {
		int e = errno;
		uvm__sys_munmap(p, size + UVM_PAGE_SIZE);
		return e;
	}
	f->stack = p + UVM_PAGE_SIZE;
	f->size = size;
	return 0;
}

void uvm__fiber_free_stack(struct uvm_fiber *f)
{
	if (f->stack)
		uvm__sys_munmap(f->stack - UVM_PAGE_SIZE, f->size + UVM_PAGE_SIZE);
	f->stack = NULL;
	f->size = 0;
}
