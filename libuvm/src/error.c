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

uvmError_t uvm__not_ready(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_message, sizeof last_message, fmt, ap);
	va_end(ap);
	return uvmErrorNotReady;
}

void uvm__errs_add(struct uvm_errs *e, uvmError_t code, const char *msg, size_t n)
{
	if (!e->code)
		e->code = code;
	if (e->len + 3 >= sizeof e->msg)
		return;
	int k = snprintf(e->msg + e->len, sizeof e->msg - e->len, "%s%.*s", e->len ? "; " : "", (int)n, msg);
	if (k > 0)
		e->len = e->len + (size_t)k < sizeof e->msg ? e->len + (size_t)k : sizeof e->msg - 1;
}

void uvm__errs_move(struct uvm_errs *dst, struct uvm_errs *src)
{
	if (!src->code)
		return;
	uvm__errs_add(dst, src->code, src->msg, src->len);
	src->code = uvmSuccess;
	src->len = 0;
	src->msg[0] = '\0';
}

uvmError_t uvm__errs_result(const struct uvm_errs *e)
{
	if (!e->code)
		return uvmSuccess;
	return uvm__fail(e->code, "%.*s", (int)e->len, e->msg);
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
	case uvmErrorInvalidConfiguration:
		return "uvmErrorInvalidConfiguration";
	case uvmErrorInvalidPitchValue:
		return "uvmErrorInvalidPitchValue";
	case uvmErrorUnsupportedLimit:
		return "uvmErrorUnsupportedLimit";
	case uvmErrorCooperativeLaunchTooLarge:
		return "uvmErrorCooperativeLaunchTooLarge";
	case uvmErrorInvalidDevice:
		return "uvmErrorInvalidDevice";
	case uvmErrorInvalidResourceHandle:
		return "uvmErrorInvalidResourceHandle";
	case uvmErrorNotReady:
		return "uvmErrorNotReady";
	case uvmErrorPeerAccessAlreadyEnabled:
		return "uvmErrorPeerAccessAlreadyEnabled";
	case uvmErrorPeerAccessNotEnabled:
		return "uvmErrorPeerAccessNotEnabled";
	case uvmErrorLaunchFailure:
		return "uvmErrorLaunchFailure";
	case uvmErrorNotPermitted:
		return "uvmErrorNotPermitted";
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
	case uvmErrorInvalidConfiguration:
		return "invalid configuration argument: a grid or block past the device's limits";
	case uvmErrorInvalidPitchValue:
		return "invalid pitch argument";
	case uvmErrorUnsupportedLimit:
		return "limit is not supported on this device";
	case uvmErrorCooperativeLaunchTooLarge:
		return "too many blocks in cooperative launch";
	case uvmErrorInvalidDevice:
		return "invalid device ordinal";
	case uvmErrorInvalidResourceHandle:
		return "invalid resource handle";
	case uvmErrorNotReady:
		return "device not ready";
	case uvmErrorPeerAccessAlreadyEnabled:
		return "peer access is already enabled";
	case uvmErrorPeerAccessNotEnabled:
		return "peer access has not been enabled";
	case uvmErrorLaunchFailure:
		return "unspecified launch failure: a kernel crashed, or its device process died or could not start";
	case uvmErrorNotPermitted:
		return "operation not permitted: a host function may not call the API";
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

uvmError_t uvm__refuse_in_device(const char *fn)
{
	return uvm__fail(uvmErrorNotSupported, "%s called in device %d's process (by a kernel): kernels cannot use the host API", fn,
			 uvm__device_process);
}
