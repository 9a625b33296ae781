/* error.c: error codes, their names, and each thread's last error. */
#include "internal.h"

#include <stdio.h>
#include <string.h>


/* CUDA keeps the last error per thread; so does libuvm, with the message
 * that explains it. */
static __thread uvmError_t last_error;
static __thread char last_message[512];

uvmError_t uvm__fail(uvmError_t err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_message, sizeof last_message, fmt, ap);
	va_end(ap);
	last_error = err;
	return err;
}

uvmError_t uvm__from_wire(uint32_t status)
{
	switch (status) {
	case UVM_WIRE_OK:
		return uvmSuccess;
	case UVM_WIRE_INVALID_VALUE:
		return uvmErrorInvalidValue;
	case UVM_WIRE_MEMORY_ALLOCATION:
		return uvmErrorMemoryAllocation;
	case UVM_WIRE_INVALID_DEVICE:
		return uvmErrorInvalidDevice;
	case UVM_WIRE_INITIALIZATION:
		return uvmErrorInitializationError;
	case UVM_WIRE_NOT_SUPPORTED:
		return uvmErrorNotSupported;
	case UVM_WIRE_LAUNCH_FAILURE:
		return uvmErrorLaunchFailure;
	}
	return uvmErrorUnknown;
}

const char *uvmGetErrorName(uvmError_t err)
{
	switch (err) {
	case uvmSuccess:
		return "uvmSuccess";
	case uvmErrorInvalidValue:
		return "uvmErrorInvalidValue";
	case uvmErrorMemoryAllocation:
		return "uvmErrorMemoryAllocation";
	case uvmErrorInitializationError:
		return "uvmErrorInitializationError";
	case uvmErrorInvalidDevice:
		return "uvmErrorInvalidDevice";
	case uvmErrorLaunchFailure:
		return "uvmErrorLaunchFailure";
	case uvmErrorNotSupported:
		return "uvmErrorNotSupported";
	case uvmErrorServerGone:
		return "uvmErrorServerGone";
	case uvmErrorUnknown:
		return "uvmErrorUnknown";
	}
	return "unrecognized error code";
}

const char *uvmGetErrorString(uvmError_t err)
{
	switch (err) {
	case uvmSuccess:
		return "no error";
	case uvmErrorInvalidValue:
		return "invalid argument";
	case uvmErrorMemoryAllocation:
		return "out of memory";
	case uvmErrorInitializationError:
		return "initialization error: no fault server could be reached or started";
	case uvmErrorInvalidDevice:
		return "invalid device ordinal";
	case uvmErrorLaunchFailure:
		return "unspecified launch failure: a kernel crashed or its device process died";
	case uvmErrorNotSupported:
		return "operation not supported";
	case uvmErrorServerGone:
		return "the fault server exited";
	case uvmErrorUnknown:
		return "unknown error";
	}
	return "unrecognized error code";
}

uvmError_t uvmGetLastError(void)
{
	uvmError_t e = last_error;
	last_error = uvmSuccess;
	return e;
}

uvmError_t uvmPeekAtLastError(void) { return last_error; }

const char *uvmGetLastErrorMessage(void) { return last_message; }
