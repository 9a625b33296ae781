/* Copyright (c) 2022, NVIDIA CORPORATION. All rights reserved.
 *
 * Redistribution and use in source and binary forms, with or without
 * modification, are permitted provided that the following conditions
 * are met:
 *  * Redistributions of source code must retain the above copyright
 *    notice, this list of conditions and the following disclaimer.
 *  * Redistributions in binary form must reproduce the above copyright
 *    notice, this list of conditions and the following disclaimer in the
 *    documentation and/or other materials provided with the distribution.
 *  * Neither the name of NVIDIA CORPORATION nor the names of its
 *    contributors may be used to endorse or promote products derived
 *    from this software without specific prior written permission.
 *
 * THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS ``AS IS'' AND ANY
 * EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
 * IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
 * PURPOSE ARE DISCLAIMED.  IN NO EVENT SHALL THE COPYRIGHT OWNER OR
 * CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
 * EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
 * PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
 * PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY
 * OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
 * (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
 * OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 */
/*
 * helper_cuda.h for softuvm: the part of the CUDA samples' helpers
 * (Common/helper_cuda.h, helper_string.h, helper_timer.h and
 * helper_functions.h of https://github.com/NVIDIA/cuda-samples) that the
 * samples ported here use, translated to C on uvm.h as the samples are:
 * cudaX is uvmX, templates and classes are functions and a struct. The
 * behaviour is the original's: checkCudaErrors prints the call, its error
 * code and name and exits 1 (and adds softuvm's message, which says what
 * went wrong in words); the command-line parsers take -flag, --flag and
 * --flag=value alike; the timers measure wall-clock milliseconds.
 */
#ifndef HELPER_CUDA_H
#define HELPER_CUDA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "uvm_cuda.h"

#ifndef EXIT_WAIVED
#define EXIT_WAIVED 2
#endif

/* The CUDA runtime version whose calls uvm.h mirrors (12.2 added the
 * location forms of prefetch and advice), for the samples' #if tests. */
#ifndef CUDART_VERSION
#define CUDART_VERSION 12020
#endif

/* ---- helper_string.h ---- */

static inline int stringRemoveDelimiter(char delimiter, const char *string)
{
	int string_start = 0;

	while (string[string_start] == delimiter) {
		string_start++;
	}

	if (string_start >= (int)(strlen(string) - 1)) {
		return 0;
	}

	return string_start;
}

static inline bool checkCmdLineFlag(const int argc, const char **argv, const char *string_ref)
{
	bool bFound = false;

	if (argc >= 1) {
		for (int i = 1; i < argc; i++) {
			int string_start = stringRemoveDelimiter('-', argv[i]);
			const char *string_argv = &argv[i][string_start];

			const char *equal_pos = strchr(string_argv, '=');
			int argv_length = (int)(equal_pos == 0 ? strlen(string_argv) : (size_t)(equal_pos - string_argv));

			int length = (int)strlen(string_ref);

			if (length == argv_length && !strncasecmp(string_argv, string_ref, length)) {
				bFound = true;
				continue;
			}
		}
	}

	return bFound;
}

static inline int getCmdLineArgumentInt(const int argc, const char **argv, const char *string_ref)
{
	bool bFound = false;
	int value = -1;

	if (argc >= 1) {
		for (int i = 1; i < argc; i++) {
			int string_start = stringRemoveDelimiter('-', argv[i]);
			const char *string_argv = &argv[i][string_start];
			int length = (int)strlen(string_ref);

			if (!strncasecmp(string_argv, string_ref, length)) {
				if (length + 1 <= (int)strlen(string_argv)) {
					int auto_inc = (string_argv[length] == '=') ? 1 : 0;
					value = atoi(&string_argv[length + auto_inc]);
				} else {
					value = 0;
				}

				bFound = true;
				continue;
			}
		}
	}

	if (bFound) {
		return value;
	} else {
		return 0;
	}
}

static inline bool getCmdLineArgumentString(const int argc, const char **argv, const char *string_ref, char **string_retval)
{
	bool bFound = false;

	if (argc >= 1) {
		for (int i = 1; i < argc; i++) {
			int string_start = stringRemoveDelimiter('-', argv[i]);
			char *string_argv = (char *)&argv[i][string_start];
			int length = (int)strlen(string_ref);

			if (!strncasecmp(string_argv, string_ref, length)) {
				*string_retval = &string_argv[length + 1];
				bFound = true;
				continue;
			}
		}
	}

	if (!bFound) {
		*string_retval = NULL;
	}

	return bFound;
}

/* ---- helper_timer.h: StopWatchLinux as a struct ---- */

typedef struct StopWatchInterface {
	struct timespec start_time;
	float diff_time;  /* between the last start and stop, ms */
	float total_time; /* of every start and stop, ms */
	bool running;
	int clock_sessions;
} StopWatchInterface;

static inline float sdk__diff_time(const StopWatchInterface *t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (float)((now.tv_sec - t->start_time.tv_sec) * 1e3 + (now.tv_nsec - t->start_time.tv_nsec) * 1e-6);
}

static inline bool sdkCreateTimer(StopWatchInterface **timer_interface)
{
	*timer_interface = (StopWatchInterface *)calloc(1, sizeof(StopWatchInterface));
	return *timer_interface != NULL;
}

static inline bool sdkDeleteTimer(StopWatchInterface **timer_interface)
{
	free(*timer_interface);
	*timer_interface = NULL;
	return true;
}

static inline bool sdkStartTimer(StopWatchInterface **timer_interface)
{
	StopWatchInterface *t = *timer_interface;
	clock_gettime(CLOCK_MONOTONIC, &t->start_time);
	t->running = true;
	return true;
}

static inline bool sdkStopTimer(StopWatchInterface **timer_interface)
{
	StopWatchInterface *t = *timer_interface;
	t->diff_time = sdk__diff_time(t);
	t->total_time += t->diff_time;
	t->running = false;
	t->clock_sessions++;
	return true;
}

static inline bool sdkResetTimer(StopWatchInterface **timer_interface)
{
	StopWatchInterface *t = *timer_interface;
	t->diff_time = 0;
	t->total_time = 0;
	t->clock_sessions = 0;
	if (t->running) {
		clock_gettime(CLOCK_MONOTONIC, &t->start_time);
	}
	return true;
}

static inline float sdkGetTimerValue(StopWatchInterface **timer_interface)
{
	StopWatchInterface *t = *timer_interface;
	float retval = t->total_time;
	if (t->running) {
		retval += sdk__diff_time(t);
	}
	return retval;
}

static inline float sdkGetAverageTimerValue(StopWatchInterface **timer_interface)
{
	StopWatchInterface *t = *timer_interface;
	return t->clock_sessions > 0 ? t->total_time / t->clock_sessions : 0.0f;
}

/* ---- helper_cuda.h ---- */

static inline void check(uvmError_t result, char const *const func, const char *const file, int const line)
{
	if (result) {
		fprintf(stderr, "CUDA error at %s:%d code=%d(%s) \"%s\" \n", file, line, (unsigned int)result, uvmGetErrorName(result), func);
		fprintf(stderr, "softuvm: %s\n", uvmGetLastErrorMessage());
		exit(EXIT_FAILURE);
	}
}

#define checkCudaErrors(val) check((val), #val, __FILE__, __LINE__)

#define getLastCudaError(msg) __getLastCudaError(msg, __FILE__, __LINE__)

static inline void __getLastCudaError(const char *errorMessage, const char *file, const int line)
{
	uvmError_t err = uvmGetLastError();

	if (uvmSuccess != err) {
		fprintf(stderr,
			"%s(%i) : getLastCudaError() CUDA error :"
			" %s : (%d) %s.\n",
			file, line, errorMessage, (int)err, uvmGetErrorString(err));
		exit(EXIT_FAILURE);
	}
}

static inline int _ConvertSMVer2Cores(int major, int minor)
{
	typedef struct {
		int SM; /* 0xMm: M = SM major version, m = SM minor version */
		int Cores;
	} sSMtoCores;

	sSMtoCores nGpuArchCoresPerSM[] = {{0x30, 192}, {0x32, 192}, {0x35, 192}, {0x37, 192}, {0x50, 128}, {0x52, 128}, {0x53, 128},
					   {0x60, 64},  {0x61, 128}, {0x62, 128}, {0x70, 64},  {0x72, 64},  {0x75, 64},  {0x80, 64},
					   {0x86, 128}, {0x87, 128}, {0x89, 128}, {0x90, 128}, {0xa0, 128}, {0xa1, 128}, {0xa3, 128},
					   {0xb0, 128}, {0xc0, 128}, {0xc1, 128}, {-1, -1}};

	int index = 0;

	while (nGpuArchCoresPerSM[index].SM != -1) {
		if (nGpuArchCoresPerSM[index].SM == ((major << 4) + minor)) {
			return nGpuArchCoresPerSM[index].Cores;
		}

		index++;
	}

	printf("MapSMtoCores for SM %d.%d is undefined."
	       "  Default to use %d Cores/SM\n",
	       major, minor, nGpuArchCoresPerSM[index - 1].Cores);
	return nGpuArchCoresPerSM[index - 1].Cores;
}

static inline const char *_ConvertSMVer2ArchName(int major, int minor)
{
	typedef struct {
		int SM;
		const char *name;
	} sSMtoArchName;

	sSMtoArchName nGpuArchNameSM[] = {{0x30, "Kepler"},    {0x32, "Kepler"},    {0x35, "Kepler"},   {0x37, "Kepler"},  {0x50, "Maxwell"},
					  {0x52, "Maxwell"},   {0x53, "Maxwell"},   {0x60, "Pascal"},   {0x61, "Pascal"},  {0x62, "Pascal"},
					  {0x70, "Volta"},     {0x72, "Xavier"},    {0x75, "Turing"},   {0x80, "Ampere"},  {0x86, "Ampere"},
					  {0x87, "Ampere"},    {0x89, "Ada"},       {0x90, "Hopper"},   {0xa0, "Blackwell"}, {0xa1, "Blackwell"},
					  {0xa3, "Blackwell"}, {0xb0, "Blackwell"}, {0xc0, "Blackwell"}, {0xc1, "Blackwell"}, {-1, "Graphics Device"}};

	int index = 0;

	while (nGpuArchNameSM[index].SM != -1) {
		if (nGpuArchNameSM[index].SM == ((major << 4) + minor)) {
			return nGpuArchNameSM[index].name;
		}

		index++;
	}

	printf("MapSMtoArchName for SM %d.%d is undefined."
	       "  Default to use %s\n",
	       major, minor, nGpuArchNameSM[index - 1].name);
	return nGpuArchNameSM[index - 1].name;
}

static inline int gpuDeviceInit(int devID)
{
	int device_count;
	checkCudaErrors(uvmGetDeviceCount(&device_count));

	if (device_count == 0) {
		fprintf(stderr, "gpuDeviceInit() CUDA error: "
				"no devices supporting CUDA.\n");
		exit(EXIT_FAILURE);
	}

	if (devID < 0) {
		devID = 0;
	}

	if (devID > device_count - 1) {
		fprintf(stderr, "\n");
		fprintf(stderr, ">> %d CUDA capable GPU device(s) detected. <<\n", device_count);
		fprintf(stderr,
			">> gpuDeviceInit (-device=%d) is not a valid"
			" GPU device. <<\n",
			devID);
		fprintf(stderr, "\n");
		return -devID;
	}

	int computeMode = -1, major = 0, minor = 0;
	checkCudaErrors(uvmDeviceGetAttribute(&computeMode, uvmDevAttrComputeMode, devID));
	checkCudaErrors(uvmDeviceGetAttribute(&major, uvmDevAttrComputeCapabilityMajor, devID));
	checkCudaErrors(uvmDeviceGetAttribute(&minor, uvmDevAttrComputeCapabilityMinor, devID));
	if (computeMode == uvmComputeModeProhibited) {
		fprintf(stderr, "Error: device is running in <Compute Mode "
				"Prohibited>, no threads can use cudaSetDevice().\n");
		return -1;
	}

	if (major < 1) {
		fprintf(stderr, "gpuDeviceInit(): GPU device does not support CUDA.\n");
		exit(EXIT_FAILURE);
	}

	checkCudaErrors(uvmSetDevice(devID));
	printf("gpuDeviceInit() CUDA Device [%d]: \"%s\n", devID, _ConvertSMVer2ArchName(major, minor));

	return devID;
}

static inline int gpuGetMaxGflopsDeviceId(void)
{
	int current_device = 0, sm_per_multiproc = 0;
	int max_perf_device = 0;
	int device_count = 0;
	int devices_prohibited = 0;

	uint64_t max_compute_perf = 0;
	checkCudaErrors(uvmGetDeviceCount(&device_count));

	if (device_count == 0) {
		fprintf(stderr, "gpuGetMaxGflopsDeviceId() CUDA error:"
				" no devices supporting CUDA.\n");
		exit(EXIT_FAILURE);
	}

	current_device = 0;

	while (current_device < device_count) {
		int computeMode = -1, major = 0, minor = 0;
		checkCudaErrors(uvmDeviceGetAttribute(&computeMode, uvmDevAttrComputeMode, current_device));
		checkCudaErrors(uvmDeviceGetAttribute(&major, uvmDevAttrComputeCapabilityMajor, current_device));
		checkCudaErrors(uvmDeviceGetAttribute(&minor, uvmDevAttrComputeCapabilityMinor, current_device));

		if (computeMode != uvmComputeModeProhibited) {
			if (major == 9999 && minor == 9999) {
				sm_per_multiproc = 1;
			} else {
				sm_per_multiproc = _ConvertSMVer2Cores(major, minor);
			}
			int multiProcessorCount = 0, clockRate = 0;
			checkCudaErrors(uvmDeviceGetAttribute(&multiProcessorCount, uvmDevAttrMultiProcessorCount, current_device));
			uvmError_t result = uvmDeviceGetAttribute(&clockRate, uvmDevAttrClockRate, current_device);
			if (result != uvmSuccess) {
				if (result == uvmErrorInvalidValue) {
					clockRate = 1;
				} else {
					fprintf(stderr, "CUDA error at %s:%d code=%d(%s) \n", __FILE__, __LINE__, (unsigned int)result,
						uvmGetErrorName(result));
					exit(EXIT_FAILURE);
				}
			}
			uint64_t compute_perf = (uint64_t)multiProcessorCount * sm_per_multiproc * clockRate;

			if (compute_perf > max_compute_perf) {
				max_compute_perf = compute_perf;
				max_perf_device = current_device;
			}
		} else {
			devices_prohibited++;
		}

		++current_device;
	}

	if (devices_prohibited == device_count) {
		fprintf(stderr, "gpuGetMaxGflopsDeviceId() CUDA error:"
				" all devices have compute mode prohibited.\n");
		exit(EXIT_FAILURE);
	}

	return max_perf_device;
}

static inline int findCudaDevice(int argc, const char **argv)
{
	int devID = 0;

	if (checkCmdLineFlag(argc, argv, "device")) {
		devID = getCmdLineArgumentInt(argc, argv, "device=");

		if (devID < 0) {
			printf("Invalid command line parameter\n ");
			exit(EXIT_FAILURE);
		} else {
			devID = gpuDeviceInit(devID);

			if (devID < 0) {
				printf("exiting...\n");
				exit(EXIT_FAILURE);
			}
		}
	} else {
		devID = gpuGetMaxGflopsDeviceId();
		checkCudaErrors(uvmSetDevice(devID));
		int major = 0, minor = 0;
		checkCudaErrors(uvmDeviceGetAttribute(&major, uvmDevAttrComputeCapabilityMajor, devID));
		checkCudaErrors(uvmDeviceGetAttribute(&minor, uvmDevAttrComputeCapabilityMinor, devID));
		printf("GPU Device %d: \"%s\" with compute capability %d.%d\n\n", devID, _ConvertSMVer2ArchName(major, minor), major, minor);
	}

	return devID;
}

static inline bool checkCudaCapabilities(int major_version, int minor_version)
{
	int dev;
	int major = 0, minor = 0;

	checkCudaErrors(uvmGetDevice(&dev));
	checkCudaErrors(uvmDeviceGetAttribute(&major, uvmDevAttrComputeCapabilityMajor, dev));
	checkCudaErrors(uvmDeviceGetAttribute(&minor, uvmDevAttrComputeCapabilityMinor, dev));

	if ((major > major_version) || (major == major_version && minor >= minor_version)) {
		printf("  Device %d: <%16s >, Compute SM %d.%d detected\n", dev, _ConvertSMVer2ArchName(major, minor), major, minor);
		return true;
	} else {
		printf("  No GPU device was found that can support "
		       "CUDA compute capability %d.%d.\n",
		       major_version, minor_version);
		return false;
	}
}

#endif /* HELPER_CUDA_H */
