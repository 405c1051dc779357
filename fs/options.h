/* options: the reshardfs -o options, parsed with one fuse_opt table that
 * also prints --help.  Values are validated here; a bad one is reported as
 * "-o name=value: problem" and the mount is refused.
 */
#ifndef RS_OPTIONS_H
#define RS_OPTIONS_H

#include <fuse_opt.h>
#include <stdbool.h>
#include <stdint.h>

#include "formats/checkpoint.h"
#include "gpu/executor.h"
#include "planner/layout.h"

#define RS_DEFAULT_CACHE_SIZE (1ull << 30)

typedef struct {
	char *source;           /* first non-option argument */
	rs_layout_opts layout;
	char *rules;            /* -o rules=FILE */
	char *params;           /* -o params=FILE */
	uint64_t cache_size;
	bool cache_compress;
	const rs_format_def *view_format;  /* NULL: the source's default */
	rs_executor_opts exec;  /* executor=, gpus=, gpu_mem= */
	bool show_help;
	bool show_version;
	/* raw option strings, validated by rs_options_validate */
	char *tp_s, *pp_s, *src_tp_s, *vocab_size_s, *vocab_divisor_s;
	char *cache_size_s, *cache_compress_s, *format_s;
	char *executor_s, *dtype_s, *gpus_s, *gpu_mem_s, *vpp_s;
	bool in_gpus;           /* parsing: the last option was gpus= */
} rs_options;

/* Parses and removes reshardfs's own options and SOURCE from args; the
 * rest (mountpoint, FUSE options) stays for libfuse.  Returns 0 or -1. */
int rs_options_parse(struct fuse_args *args, rs_options *o);

/* Converts and checks the raw values; prints one line per problem to
 * stderr.  Returns 0 when all are valid. */
int rs_options_validate(rs_options *o);

void rs_options_free(rs_options *o);

/* Prints the reshardfs section of --help. */
void rs_options_help(void);

#endif
