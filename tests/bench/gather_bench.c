/* gather_bench: the measurement behind the CPU executor's choice between
 * one pread per strided row and a copy out of a short-lived mapping
 * (gpu/cpu.c MAPPED_ROW_MAX).
 *
 *     gather_bench FILE [MIB]
 *
 * FILE (at least MIB MiB, default 256; read once first so it sits in the
 * page cache) is gathered as rows of L bytes at a stride of 4L - the shape
 * of a tp 2 -> 8 row-parallel split - in 1 MiB pieces, as the executor cuts
 * them, for L from 256 B to 1 MiB.  Prints GB/s of rows copied per method.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/mapped_copy.h"

#define PIECE (1u << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Gathers every row of `len` at stride 4*len in [0, span) into dst, one
 * piece at a time; returns seconds. */
static double run(int fd, uint8_t *dst, uint64_t span, uint64_t len,
		  int mapped)
{
	uint64_t stride = 4 * len, rows = span / stride;
	uint64_t per_piece = PIECE / len ? PIECE / len : 1;
	double t0 = now();

	for (uint64_t r = 0; r < rows; r += per_piece) {
		uint64_t n = rows - r < per_piece ? rows - r : per_piece;

		if (mapped) {
			if (rs_mapped_gather(fd, dst, len, r * stride, stride, len,
					     n) != 0) {
				fprintf(stderr, "mapped gather failed\n");
				exit(1);
			}
			continue;
		}
		for (uint64_t i = 0; i < n; i++)
			if (pread(fd, dst + i * len, len,
				  (off_t)((r + i) * stride)) != (ssize_t)len) {
				fprintf(stderr, "short pread\n");
				exit(1);
			}
	}
	return now() - t0;
}

int main(int argc, char **argv)
{
	uint64_t span = (argc > 2 ? strtoull(argv[2], NULL, 10) : 256) << 20;
	uint8_t *dst = malloc(PIECE);
	int fd;

	if (argc < 2 || !dst) {
		fprintf(stderr, "usage: gather_bench FILE [MIB]\n");
		return 2;
	}
	fd = open(argv[1], O_RDONLY);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	for (uint64_t off = 0; off < span; off += PIECE)   /* warm */
		if (pread(fd, dst, PIECE, (off_t)off) != PIECE) {
			fprintf(stderr, "%s: shorter than %llu MiB\n", argv[1],
				(unsigned long long)(span >> 20));
			return 1;
		}
	printf("row bytes  pread GB/s  mapped GB/s  mapped/pread\n");
	for (uint64_t len = 256; len <= (1u << 20); len *= 4) {
		double best[2] = { 1e9, 1e9 };
		double bytes = (double)(span / (4 * len) * len);

		for (int rep = 0; rep < 3; rep++)
			for (int m = 0; m < 2; m++) {
				double t = run(fd, dst, span, len, m);

				if (t < best[m])
					best[m] = t;
			}
		printf("%9llu  %10.2f  %11.2f  %12.2f\n", (unsigned long long)len,
		       bytes / best[0] / 1e9, bytes / best[1] / 1e9,
		       best[0] / best[1]);
	}
	close(fd);
	free(dst);
	return 0;
}
