/* options: the reshardfs -o options, one list (RS_OPTIONS) from which the
 * fuse_opt table, --help and the raw values are made.  Values are
 * validated here; a bad one is reported as "-o name=value: problem" and
 * the mount is refused.
 *
 * Ownership: rs_options owns every string in it; rs_options_free frees
 * them.
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

/* Every reshardfs -o option, in --help order, as X(kind, name, field, arg,
 * help).  The one list generates the fuse_opt table, the --help lines, the
 * rs_options field holding each raw value and the freeing of them, so they
 * cannot drift apart; rs_options_validate converts the values.
 *   kind   STR: "name=VALUE", the value stored as given;
 *          GPUS: "gpus=LIST", assembled by fs/options.c because fuse_opt
 *          splits -o at commas;
 *   name   as written after -o;
 *   field  the char * member of rs_options that receives the value;
 *   arg    what --help shows after "name=";
 *   help   its --help text, a "\n" in it starting an indented line. */
#define RS_OPTIONS(X)                                                         \
	X(STR, "tp", tp_s, "N",                                               \
	  "target tensor parallelism (default: the source's)")                \
	X(STR, "pp", pp_s, "N",                                               \
	  "target pipeline parallelism, checked against the\n"                \
	  "layer count (renames layers only in per-rank\n"                    \
	  "megatron views)")                                                  \
	X(STR, "vpp", vpp_s, "N",                                             \
	  "virtual pipeline chunks per stage (megatron views)")               \
	X(STR, "ep", ep_s, "N",                                               \
	  "target expert parallelism of a Mixture-of-Experts\n"              \
	  "checkpoint: must divide the experts per layer")                   \
	X(STR, "etp", etp_s, "N",                                             \
	  "target expert tensor parallelism (default: tp)")                   \
	X(STR, "experts", experts_s, "FORM",                                  \
	  "expert weight keys of a per-rank megatron view:\n"                \
	  "sequential (SequentialMLP) or grouped\n"                          \
	  "(TEGroupedMLP) (default: the source's)")                          \
	X(STR, "src_tp", src_tp_s, "N",                                       \
	  "source tensor parallelism (default: inferred from\n"               \
	  "the stored chunk grid)")                                           \
	X(STR, "vocab_size", vocab_size_s, "N",                               \
	  "unpadded vocabulary size; the view pads it to\n"                   \
	  "ceil(N/(vocab_divisor*tp))*vocab_divisor*tp rows")                 \
	X(STR, "vocab_divisor", vocab_divisor_s, "N",                         \
	  "Megatron's make_vocab_size_divisible_by (default 128)")            \
	X(STR, "rules", rules, "FILE",                                        \
	  "JSON sharding rules tried before the built-ins")                   \
	X(STR, "params", params, "FILE",                                      \
	  "names and shapes of a metaseq checkpoint's flat\n"                 \
	  "params, for files without shard_metadata whose\n"                 \
	  "cfg cannot describe them (checked against cfg)")                   \
	X(STR, "max_tensors", max_tensors_s, "N",                             \
	  "refuse checkpoints of more tensors (default 262144)")              \
	X(STR, "max_metadata", max_metadata_s, "SIZE",                        \
	  "refuse checkpoints whose headers, pickles and JSON\n"              \
	  "pass SIZE together (default 1G)")                                  \
	X(STR, "cache_size", cache_size_s, "SIZE",                            \
	  "block cache budget: bytes, or K/M/G/T (default 1G;\n"              \
	  "at least 1M)")                                                     \
	X(STR, "format", format_s, "FMT",                                     \
	  "layout of the view: zarr, torch_dist, megatron\n"                  \
	  "(per-rank .pt), safetensors, hf (an HF\n"                          \
	  "transformers model directory: config.json and\n"                  \
	  "HF-named weights), metaseq (unflattened\n"                        \
	  "metaseq state dicts per model part) or universal\n"               \
	  "(DeepSpeed's universal checkpoint of a ZeRO\n"                    \
	  "save) (default: the source's own; safetensors\n"                  \
	  "for metaseq shards and DeepSpeed saves)")                          \
	X(STR, "names", names, "ECO",                                         \
	  "mcore: an HF model directory of a known family\n"                \
	  "under megatron-core GPTModel names (format=\n"                    \
	  "torch_dist, the default, or zarr; at any tp, ep)")                \
	X(STR, "hf_config", hf_config, "FILE",                                \
	  "JSON of config.json fields for format=hf of a\n"                 \
	  "Megatron checkpoint: what its args do not record\n"              \
	  "(checked against them and the shapes); its\n"                    \
	  "architectures name the family.  Of a DeepSpeed\n"               \
	  "save: its config.json, instead of the save's")                    \
	X(STR, "hf_experts", hf_experts, "FORM",                              \
	  "format=hf of an MoE model: per_expert (default:\n"               \
	  "experts.<e>.gate_proj..., as save_pretrained,\n"                \
	  "the Hub and vLLM) or packed (transformers 5's\n"                 \
	  "experts.gate_up_proj [E, 2F, H])")                                  \
	X(STR, "shard_size", shard_size_s, "SIZE",                            \
	  "format=hf: the most weight bytes per safetensors\n"              \
	  "file before HF's sharded form (default\n"                        \
	  "5000000000, save_pretrained's 5GB)")                               \
	X(STR, "passthrough", passthrough_s, "MODE",                          \
	  "auto (default): the kernel reads view files without\n"              \
	  "the daemon where it can (FUSE passthrough: Linux\n"                \
	  ">= 6.9, CAP_SYS_ADMIN), from in-memory snapshots\n"              \
	  "built at open; off: every read through the daemon")                \
	X(STR, "passthrough_max", passthrough_max_s, "SIZE",                  \
	  "largest view file built into a snapshot\n"                        \
	  "(default: a quarter of cache_size)")                               \
	X(STR, "snapshot_pages", snapshot_pages_s, "P",                       \
	  "huge: snapshots on a private tmpfs of 2 MiB pages\n"              \
	  "where the daemon may mount one; small: memfds of\n"              \
	  "the machine's shmem page size; auto (default): huge\n"           \
	  "unless a virtio-balloon takes freed memory back")                  \
	X(STR, "cache_compress", cache_compress_s, "ALG",                     \
	  "lz4: keep colder cached blocks LZ4-compressed;\n"                  \
	  "none (default): keep every cached block raw")                      \
	X(STR, "dtype", dtype_s, "T",                                         \
	  "show floating-point tensors as bf16, f16 or f32\n"                 \
	  "(rounded to nearest even; default: as stored)")                    \
	X(STR, "executor", executor_s, "E",                                   \
	  "who builds blocks: auto (default: the CPU, and a\n"                \
	  "CUDA GPU for the work it measures faster at), cpu,\n"              \
	  "or cuda (every block on the GPU; experimental)")                   \
	X(STR, "threads", threads_s, "N",                                     \
	  "threads that build blocks and snapshots: the CPU\n"               \
	  "executor's workers and the snapshot builders\n"                   \
	  "(default: one per online CPU)")                                     \
	X(GPUS, "gpus", gpus_s, "LIST",                                       \
	  "CUDA devices to use, e.g. 0,1 (default: all)")                     \
	X(STR, "gpu_mem", gpu_mem_s, "SIZE",                                  \
	  "device memory per GPU for staging (default 256M)")                 \
	X(STR, "group", group_s, "mpi",                                       \
	  "read each source byte once per job: the daemons\n"                 \
	  "started together by mpirun or srun share their\n"                  \
	  "source reads over MPI (implies -f)")                                \
	X(STR, "group_timeout", group_timeout_s, "SECONDS",                   \
	  "with group=: how long a read waits on a peer\n"                    \
	  "before reading from storage itself (default 10)")                   \
	X(STR, "group_nccl", group_nccl_s, "auto|on|off",                     \
	  "with group=: move extents GPU to GPU over NCCL;\n"                 \
	  "auto: where every member runs executor=cuda and\n"                \
	  "libnccl.so.2 loads; on: wherever each has a CUDA\n"               \
	  "device ready, or fail (default auto)")

#define RS_OPTION_FIELD(kind, name, field, arg, help) char *field;

typedef struct {
	char *source;           /* first non-option argument */
	rs_layout_opts layout;
	uint64_t cache_size;
	uint64_t max_tensors, max_metadata;     /* 0: the defaults */
	bool passthrough;       /* passthrough=auto */
	int snapshot_pages;     /* rs_snapshot_pages (fs/snapshot.h) */
	uint64_t passthrough_max;
	bool cache_compress;
	const rs_format_def *view_format;  /* NULL: the source's default */
	rs_executor_opts exec;  /* executor=, gpus=, gpu_mem=, threads= */
	bool group;             /* group=mpi */
	unsigned group_timeout_ms;
	int group_nccl;         /* rs_group_nccl_mode (fs/group_lane.h) */
	bool show_help;
	bool show_version;
	bool dry_run;           /* --dry-run: print the view, mount nothing */
	bool verbose;           /* -v: with --dry-run, a line per tensor */
	/* Each option's value as given (NULL: not given): rules and params
	 * (and names, hf_config) are used as they are, the others
	 * converted into the fields above
	 * by rs_options_validate. */
	RS_OPTIONS(RS_OPTION_FIELD)
	bool in_gpus;           /* parsing: the last option was gpus= */
	bool unknown;           /* parsing: an unknown option was refused */
} rs_options;

#undef RS_OPTION_FIELD

/* Looks for reshardfs options given the way other tools take them (a
 * bare `tp=8` that is not a path, `--tp 8`, `--tp=8`, `-tp=8`) and says,
 * on stderr, what to type instead: -1 then, else 0. */
int rs_options_hint(int argc, char *argv[]);

/* Parses and removes reshardfs's own options and SOURCE from args; the
 * rest (mountpoint, FUSE options) stays for libfuse.  An option neither
 * takes gets a line on stderr naming it (fs/option_names.h finds the
 * option meant).  Returns 0 or -1. */
int rs_options_parse(struct fuse_args *args, rs_options *o);

/* Converts and checks the raw values; prints one line per problem to
 * stderr.  Returns 0 when all are valid. */
int rs_options_validate(rs_options *o);

void rs_options_free(rs_options *o);

/* Prints the reshardfs section of --help. */
void rs_options_help(void);

#endif
