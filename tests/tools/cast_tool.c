/* cast_tool: converts stdin's elements to stdout with rs_cast_run, for
 * tests/mount/test_cast_oracle.py to hold against torch.
 *
 *     cast_tool FROM TO < in > out
 *
 * FROM and TO are dtype names as rs_dtype_name prints them (float32,
 * bfloat16, float16, float64, float8_e4m3fn, float8_e5m2).  Exits 2 on a
 * bad name or pair, 1 on an I/O error or input that is not whole
 * elements.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cast.h"

#define CHUNK (1u << 16)        /* elements per read */

static rs_dtype by_name(const char *s)
{
	static const rs_dtype all[] = {
		RS_DTYPE_F32, RS_DTYPE_BF16, RS_DTYPE_F16,
		RS_DTYPE_F64, RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2,
	};

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (strcmp(s, rs_dtype_name(all[i])) == 0)
			return all[i];
	return RS_DTYPE_INVALID;
}

int main(int argc, char **argv)
{
	rs_dtype from, to;
	unsigned fs, ts;
	uint8_t *in, *out;
	size_t got;
	int rc = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: cast_tool FROM TO < in > out\n");
		return 2;
	}
	from = by_name(argv[1]);
	to = by_name(argv[2]);
	if (!rs_cast_supported(from, to)) {
		fprintf(stderr, "cast_tool: cannot convert %s to %s\n", argv[1],
			argv[2]);
		return 2;
	}
	fs = rs_dtype_size(from);
	ts = rs_dtype_size(to);
	in = malloc((size_t)CHUNK * fs);
	out = malloc((size_t)CHUNK * ts);
	if (!in || !out) {
		fprintf(stderr, "cast_tool: out of memory\n");
		return 1;
	}
	while ((got = fread(in, 1, (size_t)CHUNK * fs, stdin)) > 0) {
		if (got % fs) {
			/* fread fills whole buffers until the end: a partial
			 * element is the input's last bytes. */
			fprintf(stderr, "cast_tool: input is not whole %s elements\n",
				argv[1]);
			rc = 1;
			break;
		}
		rs_cast_run(to, out, from, in, got / fs);
		if (fwrite(out, ts, got / fs, stdout) != got / fs) {
			perror("cast_tool: write");
			rc = 1;
			break;
		}
	}
	if (!rc && ferror(stdin)) {
		perror("cast_tool: read");
		rc = 1;
	}
	if (fflush(stdout) != 0) {
		perror("cast_tool: write");
		rc = 1;
	}
	free(in);
	free(out);
	return rc;
}
