/*
 * copy3d_test.c: 2D and 3D copies and fills with pitches (uvmMemcpy2D,
 * uvmMemset2D, uvmMemcpy3D, uvmMemset3D, their Async forms, uvmMalloc3D)
 * between managed, device and ordinary memory: every byte of each box
 * checked, and every byte between the rows left as it was. Run by
 * integration/libuvm_test.go with a private server, 2 devices of 2
 * workers and 64 MiB arenas.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

static uint8_t pattern(size_t x, size_t y, size_t z) { return (uint8_t)(x * 7 + y * 13 + z * 29 + 1); }

static void test_2d(void)
{
	const size_t width = 200, height = 50, spitch = 300, hpitch = 256;
	uint8_t *src, *back, *dev;
	size_t dpitch = 0;
	CHECK_OK(uvmMallocManaged((void **)&src, spitch * height, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocPitch((void **)&dev, &dpitch, width, height));
	CHECK(dpitch == 512);
	back = malloc(hpitch * height);
	for (size_t y = 0; y < height; y++)
		for (size_t x = 0; x < spitch; x++)
			src[y * spitch + x] = x < width ? pattern(x, y, 0) : 0xaa;
	memset(back, 0xee, hpitch * height);

	/* Managed to device, device to ordinary memory. */
	CHECK_OK(uvmMemcpy2D(dev, dpitch, src, spitch, width, height, uvmMemcpyHostToDevice));
	CHECK_OK(uvmMemcpy2D(back, hpitch, dev, dpitch, width, height, uvmMemcpyDeviceToHost));
	size_t bad = 0;
	for (size_t y = 0; y < height; y++)
		for (size_t x = 0; x < hpitch; x++)
			bad += back[y * hpitch + x] != (x < width ? pattern(x, y, 0) : 0xee); /* the gaps untouched */
	CHECK(bad == 0);

	/* A fill of part of each row of device memory, read back whole. */
	CHECK_OK(uvmMemset2D(dev + 10, dpitch, 0x5c, 50, height - 1));
	CHECK_OK(uvmMemcpy2D(back, hpitch, dev, dpitch, width, height, uvmMemcpyDefault));
	for (size_t y = 0; y < height; y++)
		for (size_t x = 0; x < width; x++)
			bad += back[y * hpitch + x] != (x >= 10 && x < 60 && y < height - 1 ? 0x5c : pattern(x, y, 0));
	CHECK(bad == 0);

	/* In stream order: a copy into device memory, a fill, a copy out. */
	uvmStream_t s;
	CHECK_OK(uvmStreamCreate(&s));
	memset(back, 0, hpitch * height);
	CHECK_OK(uvmMemcpy2DAsync(dev, dpitch, src, spitch, width, height, uvmMemcpyDefault, s));
	CHECK_OK(uvmMemset2DAsync(dev, dpitch, 0x11, 5, height, s));
	CHECK_OK(uvmMemcpy2DAsync(back, hpitch, dev, dpitch, width, height, uvmMemcpyDefault, s));
	CHECK_OK(uvmStreamSynchronize(s));
	for (size_t y = 0; y < height; y++)
		for (size_t x = 0; x < width; x++)
			bad += back[y * hpitch + x] != (x < 5 ? 0x11 : pattern(x, y, 0));
	CHECK(bad == 0);
	CHECK_OK(uvmStreamDestroy(s));

	/* Refused. */
	CHECK_ERR(uvmMemcpy2D(dev, 100, src, spitch, width, height, uvmMemcpyDefault), uvmErrorInvalidPitchValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "pitch 100 is less than the width 200") != NULL);
	CHECK_ERR(uvmMemcpy2D(dev, dpitch, src, 199, width, height, uvmMemcpyDefault), uvmErrorInvalidPitchValue);
	CHECK_ERR(uvmMemset2D(dev, (size_t)1 << 32, 0, width, 2), uvmErrorInvalidPitchValue);
	CHECK_ERR(uvmMemcpy2D(dev, dpitch, src, spitch, width, height + 1, uvmMemcpyDefault), uvmErrorInvalidValue); /* past the allocation */
	CHECK_ERR(uvmMemcpy2D(src + 1, spitch, src, spitch, width, 2, uvmMemcpyDefault), uvmErrorInvalidValue);     /* overlap */
	CHECK_ERR(uvmMemcpy2D(back, hpitch, dev, dpitch, width, height, uvmMemcpyHostToHost), uvmErrorInvalidValue); /* the kind */
	uvmGetLastError();
	CHECK_OK(uvmMemcpy2D(dev, dpitch, src, spitch, 0, height, uvmMemcpyDefault)); /* nothing */
	free(back);
	uvmFree(src);
	uvmFree(dev);
}

static void test_3d(void)
{
	/* The source: ordinary memory of 6 slices of 24 rows of 128 bytes,
	 * the box (90, 15, 4) at (3, 2, 1). */
	const size_t sp = 128, sy = 24, sz = 6;
	uvmExtent box = make_uvmExtent(90, 15, 4);
	uvmPos from = make_uvmPos(3, 2, 1);
	uint8_t *host = malloc(sp * sy * sz);
	for (size_t z = 0; z < sz; z++)
		for (size_t y = 0; y < sy; y++)
			for (size_t x = 0; x < sp; x++)
				host[(z * sy + y) * sp + x] = pattern(x, y, z);

	uvmPitchedPtr dev;
	CHECK_OK(uvmMalloc3D(&dev, make_uvmExtent(100, 20, 5)));
	CHECK(dev.ptr != NULL && dev.pitch == 512 && dev.xsize == 100 && dev.ysize == 20);
	CHECK_OK(uvmMemset3D(dev, 0x77, make_uvmExtent(100, 20, 5)));

	uvmMemcpy3DParms p = {0};
	p.srcPtr = make_uvmPitchedPtr(host, sp, sp, sy);
	p.srcPos = from;
	p.dstPtr = dev;
	p.dstPos = make_uvmPos(0, 1, 0);
	p.extent = box;
	p.kind = uvmMemcpyHostToDevice;
	CHECK_OK(uvmMemcpy3D(&p));

	/* Back whole into managed memory, through the Async form. */
	uint8_t *out;
	CHECK_OK(uvmMallocManaged((void **)&out, 100 * 20 * 5, uvmMemAttachGlobal));
	uvmMemcpy3DParms q = {0};
	q.srcPtr = dev;
	q.dstPtr = make_uvmPitchedPtr(out, 100, 100, 20);
	q.extent = make_uvmExtent(100, 20, 5);
	q.kind = uvmMemcpyDefault;
	uvmStream_t s;
	CHECK_OK(uvmStreamCreate(&s));
	CHECK_OK(uvmMemcpy3DAsync(&q, s));
	CHECK_OK(uvmStreamSynchronize(s));
	size_t bad = 0;
	for (size_t z = 0; z < 5; z++)
		for (size_t y = 0; y < 20; y++)
			for (size_t x = 0; x < 100; x++) {
				bool in = z < box.depth && y >= 1 && y < 1 + box.height && x < box.width;
				uint8_t want = in ? pattern(x + from.x, y - 1 + from.y, z + from.z) : 0x77;
				if (out[(z * 20 + y) * 100 + x] != want && bad++ < 3)
					fprintf(stderr, "3D: (%zu,%zu,%zu) is %#x, want %#x\n", x, y, z, out[(z * 20 + y) * 100 + x], want);
			}
	CHECK(bad == 0);

	/* Filled in stream order. */
	CHECK_OK(uvmMemset3DAsync(dev, 0, make_uvmExtent(100, 20, 5), s));
	CHECK_OK(uvmMemcpy3DAsync(&q, s));
	CHECK_OK(uvmStreamSynchronize(s));
	for (size_t i = 0; i < 100 * 20 * 5; i++)
		bad += out[i] != 0;
	CHECK(bad == 0);
	CHECK_OK(uvmStreamDestroy(s));

	/* Refused. */
	uvmMemcpy3DParms r = p;
	r.srcArray = (void *)1;
	CHECK_ERR(uvmMemcpy3D(&r), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "CUDA array") != NULL);
	r = p;
	r.srcPos.x = 50; /* 50 + 90 bytes past the 128-byte pitch */
	CHECK_ERR(uvmMemcpy3D(&r), uvmErrorInvalidPitchValue);
	r = p;
	r.srcPtr.ysize = 10; /* 2 + 15 rows do not fit slices of 10 */
	CHECK_ERR(uvmMemcpy3D(&r), uvmErrorInvalidValue);
	r = p;
	r.extent.depth = 6; /* the sixth slice past the device memory */
	CHECK_ERR(uvmMemcpy3D(&r), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy3D(NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmMalloc3D(NULL, box), uvmErrorInvalidValue);
	CHECK_ERR(uvmMalloc3D(&dev, make_uvmExtent(1, 0, 1)), uvmErrorInvalidValue);
	uvmGetLastError();
	uvmFree(out);
	free(host);
}

int main(void)
{
	test_2d();
	test_3d();
	return check_done("copy3d_test");
}
