/* pcie_bench: the host-device bandwidth of this machine, the ceiling the
 * CUDA executor's transfers are compared with (scripts/bench).
 *
 * As nvbandwidth measures it: one pinned host buffer and one device buffer
 * of 64 MiB, cudaMemcpyAsync on a stream, timed with CUDA events over N
 * back-to-back copies after one warm-up copy, per device.
 *
 *     pcie_bench [REPS [DEVICE...]]     (REPS default 20; all devices)
 *
 * Prints one JSON line:
 *     {"h2d_gbps":..,"d2h_gbps":..,"bytes":..,"reps":..,"devices":[
 *       {"device":0,"name":"..","h2d_gbps":..,"d2h_gbps":..},..]}
 * The top-level figures are the lowest over the devices measured (what
 * every one of them reaches).  GB/s are 10^9 bytes per second.  Exits 77
 * (skipped, for ctest) when no device is usable, 1 on a CUDA error.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#define BYTES (64ull << 20)

#define CK(call)                                                          \
	do {                                                              \
		cudaError_t e_ = (call);                                  \
		if (e_ != cudaSuccess) {                                  \
			fprintf(stderr, "pcie_bench: device %d: %s: %s\n",  \
				dev, #call, cudaGetErrorString(e_));      \
			exit(1);                                          \
		}                                                         \
	} while (0)

/* GB/s of `reps` copies of BYTES in direction `kind`. */
static double measure(int dev, cudaStream_t s, void *dst, const void *src,
		      cudaMemcpyKind kind, int reps)
{
	cudaEvent_t a, b;
	float ms = 0;

	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	CK(cudaMemcpyAsync(dst, src, BYTES, kind, s));      /* warm-up */
	CK(cudaEventRecord(a, s));
	for (int i = 0; i < reps; i++)
		CK(cudaMemcpyAsync(dst, src, BYTES, kind, s));
	CK(cudaEventRecord(b, s));
	CK(cudaEventSynchronize(b));
	CK(cudaEventElapsedTime(&ms, a, b));
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
	return ms > 0 ? (double)BYTES * reps / (ms * 1e-3) / 1e9 : 0;
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 20, count = 0, ndev;
	int devs[64];
	double h2d_min = 0, d2h_min = 0;
	cudaError_t e = cudaGetDeviceCount(&count);

	if (e != cudaSuccess || count <= 0) {
		fprintf(stderr, "pcie_bench: no usable device: %s\n",
			e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
		return 77;
	}
	if (reps <= 0) {
		fprintf(stderr, "usage: pcie_bench [REPS [DEVICE...]]\n");
		return 2;
	}
	ndev = argc > 2 ? argc - 2 : count;
	if (ndev > 64)
		ndev = 64;
	for (int i = 0; i < ndev; i++) {
		devs[i] = argc > 2 ? atoi(argv[i + 2]) : i;
		if (devs[i] < 0 || devs[i] >= count) {
			fprintf(stderr, "pcie_bench: no device %d (%d visible)\n",
				devs[i], count);
			return 2;
		}
	}
	printf("{\"bytes\":%llu,\"reps\":%d,\"devices\":[", BYTES, reps);
	for (int i = 0; i < ndev; i++) {
		int dev = devs[i];
		struct cudaDeviceProp prop;
		cudaStream_t s;
		void *host, *gpu;
		double h2d, d2h;

		CK(cudaSetDevice(dev));
		CK(cudaGetDeviceProperties(&prop, dev));
		CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
		CK(cudaHostAlloc(&host, BYTES, cudaHostAllocDefault));
		CK(cudaMalloc(&gpu, BYTES));
		CK(cudaMemset(gpu, 0, BYTES));
		for (size_t k = 0; k < BYTES; k += 4096)
			((volatile char *)host)[k] = 1;   /* fault it in */
		h2d = measure(dev, s, gpu, host, cudaMemcpyHostToDevice, reps);
		d2h = measure(dev, s, host, gpu, cudaMemcpyDeviceToHost, reps);
		CK(cudaFree(gpu));
		CK(cudaFreeHost(host));
		CK(cudaStreamDestroy(s));
		printf("%s{\"device\":%d,\"name\":\"%s\",\"h2d_gbps\":%.2f,"
		       "\"d2h_gbps\":%.2f}", i ? "," : "", dev, prop.name, h2d, d2h);
		if (i == 0 || h2d < h2d_min)
			h2d_min = h2d;
		if (i == 0 || d2h < d2h_min)
			d2h_min = d2h;
	}
	printf("],\"h2d_gbps\":%.2f,\"d2h_gbps\":%.2f}\n", h2d_min, d2h_min);
	return 0;
}
