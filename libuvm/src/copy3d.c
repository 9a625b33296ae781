/*
 * copy3d.c: 2D and 3D copies and fills (uvmMemcpy2D, uvmMemset2D,
 * uvmMemcpy3D, uvmMemset3D and their Async forms) and uvmMalloc3D.
 * Unified addressing lets every pointer say what memory it is, so there
 * are no CUDA arrays here: a 3D copy is between pitched pointers. Each
 * checks its shape, then copies the box row by row in one pass over the
 * spans that hold it (memory.c's uvm__copy_box), so a box of device
 * memory costs one mapping and one note to the server, not one per row.
 */
#include "internal.h"

#include <limits.h>
#include <stdio.h>

/* check_pitches checks a 2D shape: rows of width bytes, pitch apart. */
static uvmError_t check_pitch(const char *what, const char *which, size_t pitch, size_t width, size_t height)
{
	if (pitch < width)
		return uvm__fail(uvmErrorInvalidPitchValue, "%s: the %s pitch %zu is less than the width %zu", what, which, pitch, width);
	if (pitch > INT_MAX)
		return uvm__fail(uvmErrorInvalidPitchValue, "%s: the %s pitch %zu: at most %d (uvmDevAttrMaxPitch)", what, which, pitch, INT_MAX);
	if (height && pitch > SIZE_MAX / height)
		return uvm__fail(uvmErrorInvalidValue, "%s: %zu rows of %zu bytes: the size overflows", what, height, pitch);
	return uvmSuccess;
}

/* A copy or fill: the synchronous form, or one queued on a stream. */
struct box_args {
	const char *what;
	void *dst;
	size_t dpitch, dheight;
	const void *src;
	size_t spitch, sheight;
	size_t width, height, depth;
	int value;
	uvmMemcpyKind kind;
};

static uvmError_t run_box(void *arg)
{
	const struct box_args *a = arg;
	return uvm__copy_box(a->what, a->dst, a->dpitch, a->dheight, a->src, a->spitch, a->sheight, a->width, a->height, a->depth, a->value, a->kind,
			     false, NULL);
}

/* box runs a's copy or fill: queued on stream if async, else at once,
 * issued on stream (NULL: the legacy default stream; uvmStreamPerThread)
 * as a synchronous copy is, after the work before it. */
static uvmError_t box(const struct box_args *a, bool async, uvmStream_t stream)
{
	uvmError_t err;
	int device;
	if (async && stream && (err = uvm__stream_device(stream, a->what, &device)))
		return err;
	if ((int)a->kind < uvmMemcpyHostToHost || a->kind > uvmMemcpyDefault)
		return uvm__fail(uvmErrorInvalidValue, "%s: kind %d: want uvmMemcpyHostToHost (0) to uvmMemcpyDefault (4)", a->what, (int)a->kind);
	if (!async)
		return uvm__copy_box(a->what, a->dst, a->dpitch, a->dheight, a->src, a->spitch, a->sheight, a->width, a->height, a->depth, a->value,
				     a->kind, true, stream);
	if (a->width == 0 || a->height == 0 || a->depth == 0)
		return uvmSuccess;
	return uvm__stream_enqueue_host(stream, a->what, run_box, a, sizeof *a);
}

static uvmError_t memcpy2d(const char *what, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			   uvmMemcpyKind kind, bool async, uvmStream_t stream)
{
	uvmError_t err;
	if ((err = check_pitch(what, "destination", dpitch, width, height)) || (err = check_pitch(what, "source", spitch, width, height)))
		return err;
	struct box_args a = {.what = what, .dst = dst, .dpitch = dpitch, .dheight = height, .src = src, .spitch = spitch, .sheight = height,
			     .width = width, .height = height, .depth = 1, .kind = kind};
	return box(&a, async, stream);
}

uvmError_t uvmMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, uvmMemcpyKind kind)
{
	return memcpy2d("uvmMemcpy2D", dst, dpitch, src, spitch, width, height, kind, false, NULL);
}

uvmError_t uvmMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, uvmMemcpyKind kind)
{
	return memcpy2d("uvmMemcpy2D", dst, dpitch, src, spitch, width, height, kind, false, uvmStreamPerThread);
}

uvmError_t uvmMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, uvmMemcpyKind kind,
			    uvmStream_t stream)
{
	return memcpy2d("uvmMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, true, stream);
}

static uvmError_t memset2d(const char *what, void *dst, size_t pitch, int value, size_t width, size_t height, bool async, uvmStream_t stream)
{
	uvmError_t err = check_pitch(what, "destination", pitch, width, height);
	if (err)
		return err;
	struct box_args a = {.what = what, .dst = dst, .dpitch = pitch, .dheight = height, .width = width, .height = height, .depth = 1,
			     .value = value, .kind = uvmMemcpyDefault};
	return box(&a, async, stream);
}

uvmError_t uvmMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
	return memset2d("uvmMemset2D", devPtr, pitch, value, width, height, false, NULL);
}

uvmError_t uvmMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
	return memset2d("uvmMemset2D", devPtr, pitch, value, width, height, false, uvmStreamPerThread);
}

uvmError_t uvmMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height, uvmStream_t stream)
{
	return memset2d("uvmMemset2DAsync", devPtr, pitch, value, width, height, true, stream);
}

/* at is where pos lies in a pitched pointer, checked against its
 * extent's room: x plus the extent's width within the pitch, y plus its
 * height within ysize when there are several slices. */
static uvmError_t at(const char *what, const char *which, uvmPitchedPtr p, uvmPos pos, uvmExtent e, char **out)
{
	if (!p.ptr)
		return uvm__fail(uvmErrorInvalidValue, "%s: the %s pointer is NULL", what, which);
	uvmError_t err = check_pitch(what, which, p.pitch, pos.x + e.width, e.height);
	if (err)
		return err;
	if ((e.depth > 1 || pos.z > 0) && p.ysize < pos.y + e.height)
		return uvm__fail(uvmErrorInvalidValue, "%s: the %s's slices have %zu rows (ysize), fewer than the position's %zu plus the extent's %zu",
				 what, which, p.ysize, pos.y, e.height);
	*out = (char *)p.ptr + pos.z * p.pitch * p.ysize + pos.y * p.pitch + pos.x;
	return uvmSuccess;
}

static uvmError_t memcpy3d(const char *what, const uvmMemcpy3DParms *p, bool async, uvmStream_t stream)
{
	if (!p)
		return uvm__fail(uvmErrorInvalidValue, "%s: the parameters are NULL", what);
	if (p->srcArray || p->dstArray)
		return uvm__fail(uvmErrorInvalidValue, "%s: a CUDA array (srcArray, dstArray): there are none here; copy between pitched pointers", what);
	char *dst = NULL, *src = NULL;
	uvmError_t err;
	if ((err = at(what, "destination", p->dstPtr, p->dstPos, p->extent, &dst)) || (err = at(what, "source", p->srcPtr, p->srcPos, p->extent, &src)))
		return err;
	struct box_args a = {.what = what, .dst = dst, .dpitch = p->dstPtr.pitch, .dheight = p->dstPtr.ysize, .src = src, .spitch = p->srcPtr.pitch,
			     .sheight = p->srcPtr.ysize, .width = p->extent.width, .height = p->extent.height, .depth = p->extent.depth, .kind = p->kind};
	return box(&a, async, stream);
}

uvmError_t uvmMemcpy3D(const uvmMemcpy3DParms *p) { return memcpy3d("uvmMemcpy3D", p, false, NULL); }

uvmError_t uvmMemcpy3D_ptds(const uvmMemcpy3DParms *p) { return memcpy3d("uvmMemcpy3D", p, false, uvmStreamPerThread); }

uvmError_t uvmMemcpy3DAsync(const uvmMemcpy3DParms *p, uvmStream_t stream) { return memcpy3d("uvmMemcpy3DAsync", p, true, stream); }

static uvmError_t memset3d(const char *what, uvmPitchedPtr ptr, int value, uvmExtent extent, bool async, uvmStream_t stream)
{
	char *dst = NULL;
	uvmError_t err = at(what, "destination", ptr, (uvmPos){0, 0, 0}, extent, &dst);
	if (err)
		return err;
	struct box_args a = {.what = what, .dst = dst, .dpitch = ptr.pitch, .dheight = ptr.ysize, .width = extent.width, .height = extent.height,
			     .depth = extent.depth, .value = value, .kind = uvmMemcpyDefault};
	return box(&a, async, stream);
}

uvmError_t uvmMemset3D(uvmPitchedPtr pitchedDevPtr, int value, uvmExtent extent) { return memset3d("uvmMemset3D", pitchedDevPtr, value, extent, false, NULL); }

uvmError_t uvmMemset3D_ptds(uvmPitchedPtr pitchedDevPtr, int value, uvmExtent extent)
{
	return memset3d("uvmMemset3D", pitchedDevPtr, value, extent, false, uvmStreamPerThread);
}

uvmError_t uvmMemset3DAsync(uvmPitchedPtr pitchedDevPtr, int value, uvmExtent extent, uvmStream_t stream)
{
	return memset3d("uvmMemset3DAsync", pitchedDevPtr, value, extent, true, stream);
}

uvmError_t uvmMalloc3D(uvmPitchedPtr *pitchedDevPtr, uvmExtent extent)
{
	if (!pitchedDevPtr)
		return uvm__fail(uvmErrorInvalidValue, "uvmMalloc3D: pitchedDevPtr is NULL; want the address of a uvmPitchedPtr to set");
	*pitchedDevPtr = (uvmPitchedPtr){0};
	if (extent.width == 0 || extent.height == 0 || extent.depth == 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmMalloc3D of (%zu, %zu, %zu) bytes: want at least one byte in each dimension", extent.width,
				 extent.height, extent.depth);
	if (extent.depth > SIZE_MAX / extent.height)
		return uvm__fail(uvmErrorInvalidValue, "uvmMalloc3D of (%zu, %zu, %zu) bytes: the size overflows", extent.width, extent.height,
				 extent.depth);
	void *p;
	size_t pitch;
	uvmError_t err = uvmMallocPitch(&p, &pitch, extent.width, extent.height * extent.depth);
	if (err)
		return err;
	*pitchedDevPtr = (uvmPitchedPtr){.ptr = p, .pitch = pitch, .xsize = extent.width, .ysize = extent.height};
	return uvmSuccess;
}
