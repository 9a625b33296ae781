/*
 * check.h: the little harness libuvm's C tests use. Each test file is a
 * program; integration/libuvm_test.go builds it against libuvm and runs
 * it. A failed CHECK prints the file, line, expression and the library's
 * last error message, and the program exits 1 at the end.
 */
#ifndef UVM_CHECK_H
#define UVM_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uvm.h"

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                              \
	do {                                                                                     \
		check_count++;                                                                   \
		if (!(cond)) {                                                                   \
			check_failures++;                                                        \
			fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__,  \
				__LINE__, #cond, uvmGetLastErrorMessage());                      \
		}                                                                                \
	} while (0)

/* CHECK_ERR checks that call returns want, and that a failure leaves a
 * message. */
#define CHECK_ERR(call, want)                                                                    \
	do {                                                                                     \
		check_count++;                                                                   \
		uvmError_t got_ = (call);                                                        \
		if (got_ != (want)) {                                                            \
			check_failures++;                                                        \
			fprintf(stderr, "%s:%d: %s returned %s (%d), want %s (%d): %s\n",        \
				__FILE__, __LINE__, #call, uvmGetErrorName(got_), got_,          \
				uvmGetErrorName(want), (want), uvmGetLastErrorMessage());        \
		} else if ((want) != uvmSuccess && uvmGetLastErrorMessage()[0] == '\0') {        \
			check_failures++;                                                        \
			fprintf(stderr, "%s:%d: %s failed with no message\n", __FILE__,          \
				__LINE__, #call);                                                \
		}                                                                                \
	} while (0)

#define CHECK_OK(call) CHECK_ERR(call, uvmSuccess)

/* check_done prints a summary and returns the exit status. */
static inline int check_done(const char *name)
{
	if (check_failures) {
		fprintf(stderr, "%s: %d of %d checks failed\n", name, check_failures, check_count);
		return 1;
	}
	printf("%s: %d checks passed\n", name, check_count);
	return 0;
}

#endif
