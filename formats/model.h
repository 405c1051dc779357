/* model: what a checkpoint says of its model's architecture, and the
 * tables that map its tensors between ecosystems (metaseq and Megatron
 * to HF transformers, HF to Megatron), one table per model family and
 * direction.
 *
 * Data, not code.  A family (formats/model.c) is a list of rows; each
 * row says how one tensor of the target ecosystem is made of one or more
 * tensors of the source: which (name patterns), and how (an op, below).
 * Users add rows to a family with the "names" list of a -o rules= file
 * (formats/bridge/bridge.h; the schema is in reshardfs(1)).  The engine that
 * applies a table is formats/bridge/remap.c; the ops are row selections along
 * the first axis after the layer axis, so every target tensor is pieces
 * of stored tensors (planner fragments), never a copy.
 *
 * Patterns: a '#' stands for a decimal number (a layer) and comes back
 * the same in the other name; a second '#' is a second number (an
 * expert).  A source stored with its layers stacked (megatron-core's
 * dist checkpoints: decoder.layers.mlp.linear_fc1.weight of [L, ...])
 * matches a pattern with its first "#." left out, its axis 0 being the
 * layer.  A family whose `stack` is set writes its targets that way too.
 * In a row that drops tensors (`to` NULL), and only there, a '*'
 * matches any run of characters (and a '#' there any run of digits).
 * Every target is made once, by one row, of tensors of one dtype
 * (formats/bridge/remap.c refuses the rest).
 *
 * Ownership: the built-in tables are static; rows made from a rules file
 * are owned by whoever parsed them (formats/bridge/rows.c).
 * rs_model_config holds the user's hf_config text (owned, freed with the
 * checkpoint: rs_model_config_free).  Functions return 0 or a negative
 * errno.
 */
#ifndef RS_MODEL_H
#define RS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/dtype.h"

/* A row applies always, or only to models with (TIED) or without
 * (UNTIED) an output projection tied to the embeddings, or only to an hf
 * view of packed experts (-o hf_experts=packed) or of per-expert ones
 * (the default). */
typedef enum {
	RS_WHEN_ALWAYS = 0,
	RS_WHEN_TIED,
	RS_WHEN_UNTIED,
	RS_WHEN_PACKED,
	RS_WHEN_PER_EXPERT,
} rs_when;

/* How a target tensor is made of its sources' rows (axis 0 after the
 * layer axis).  H heads, G query groups, d = rows per head:
 *   SAME      from[0] as it is;
 *   QKV_Q/K/V megatron's fused qkv, G groups of [q (H/G heads); k; v]
 *             rows: the q, k or v rows of every group, in group order;
 *   FUSE_QKV  the reverse: from q, k and v (from[0..2]), groups
 *             interleaved;
 *   HALF_0/1  the first or second half of the rows ([gate; up]);
 *   CAT       from[0]'s rows then from[1]'s;
 *   VOCAB     the first `vocab` rows (padding dropped);
 *   QKV_FLAT  megatron's fused qkv as one [q (all H heads); k (G); v (G)]
 *             (Phi-3's qkv_proj);
 *   FLAT_QKV  the reverse: such a [q; k; v] into megatron's groups. */
typedef enum {
	RS_MAP_SAME = 0,
	RS_MAP_QKV_Q,
	RS_MAP_QKV_K,
	RS_MAP_QKV_V,
	RS_MAP_FUSE_QKV,
	RS_MAP_HALF_0,
	RS_MAP_HALF_1,
	RS_MAP_CAT,
	RS_MAP_VOCAB,
	RS_MAP_QKV_FLAT,
	RS_MAP_FLAT_QKV,
} rs_map_op;

#define RS_MAP_MAX_FROM 3

/* One row: target `to` (NULL: the sources are left out of the view) made
 * by `op` of from[0..] (NULL-terminated when fewer than
 * RS_MAP_MAX_FROM). */
typedef struct {
	const char *to;
	rs_map_op op;
	const char *from[RS_MAP_MAX_FROM];
	rs_when when;
	/* 0: the family's own row; n: its n-th base's.  A stored tensor a
	 * row of one tier takes is not offered to a later tier's rows: a
	 * family replaces what its base does with it (Phi-3's fused qkv). */
	unsigned tier;
} rs_map_row;

/* A config fact's type, as config.json holds it. */
typedef enum {
	RS_FACT_INT = 0,
	RS_FACT_REAL,
	RS_FACT_BOOL,
	RS_FACT_STR,
	RS_FACT_OBJECT,         /* built of sub-facts (rope_scaling) */
	RS_FACT_LIST,           /* a JSON list (mlp_only_layers) */
} rs_fact_type;

/* One config.json field of a family (formats/bridge/family.h): where
 * its value comes from, each source that gives one must agree.  Toward HF
 * the sources are, in order, the checkpoint's (args, model, absent,
 * shape, count), then the user's -o hf_config=, then value and dflt;
 * from HF, SOURCE's config.json, checked against shape and count, and
 * against value when the file gives the field. */
typedef struct rs_fact_def {
	char *hf;                       /* the config.json field */
	rs_fact_type type;
	char *args;                     /* Megatron's args field, or NULL */
	char *model;                    /* the reader's description
					 * (rs_model_config; metaseq's cfg) */
	char *shape;                    /* an HF tensor (first layer for a
					 * "#"), whose size on `axis` ... */
	int axis;
	char *per;                      /* ... divided by this fact */
	char *count;                    /* an HF pattern: how many layers */
	char **absent;                  /* bool: true when SOURCE stores none
					 * of these Megatron tensors */
	size_t nabsent;
	char *when_args;                /* args only when this args flag is
					 * true (an object: only then at all) */
	bool negate;                    /* a bool args field, negated */
	char *same_as;                  /* else the value of this fact */
	struct cJSON *value, *dflt;     /* owned, or NULL */
	bool required;                  /* refuse the view without it */
	bool nullable;                  /* toward HF, null when unknown (so
					 * that HF's own default, say a
					 * sliding window, does not apply) */
	struct rs_fact_def *fields;     /* RS_FACT_OBJECT's */
	size_t nfields;
} rs_fact_def;

/* A check: what the family cannot describe.  One of the sources holds a
 * value among `in` (a JSON list; null in it: absent is fine). */
typedef struct {
	char *args, *hf, *model;
	struct cJSON *in;               /* owned */
} rs_check_def;

/* What a family's directions share: its file, its HF names and facts. */
typedef struct rs_family_info {
	char *name;                     /* "qwen3" */
	char *path;                     /* the family file (or rules file) */
	char *base;                     /* the family it extends, or NULL */
	char **arch;                    /* HF architectures it writes and
					 * reads; the first is written */
	size_t narch;
	char *model_type;
	char **detect;                  /* Megatron tensors whose presence
					 * picks it for a source that does not
					 * say its family; NULL: never guessed */
	size_t ndetect;
	bool guessable;                 /* "detect" given (maybe empty) */
	bool per_layer;                 /* megatron keys each layer apart
					 * ("stack_layers": false: models
					 * whose layers differ, as DeepSeek-V3's
					 * dense first layers) */
	char *experts;                  /* the fact counting experts, or NULL */
	rs_fact_def *facts;
	size_t nfacts;
	rs_check_def *checks;
	size_t nchecks;
	/* Per ecosystem ("mcore", "hf", "metaseq"): its embeddings' name, a
	 * prefix its names may carry, the objects a view in it makes. */
	struct rs_family_eco {
		char *eco, *embed, *strip;
		char **objects;         /* NULL-terminated, or NULL */
	} eco[3];
	size_t neco;
} rs_family_info;

typedef struct rs_family {
	const char *name;               /* "llama" */
	const char *from;               /* source ecosystem: "mcore" */
	const char *to;                 /* target ecosystem: "hf" */
	const rs_map_row *rows;         /* ends with a row of from[0] NULL */
	bool stack;                     /* targets stack their layers */
	const char *strip;              /* a prefix source names may carry
					 * (NeMo's "model."), or NULL */
	const char *embed;              /* the source's embeddings, which a
					 * tied output projection must be */
	/* Objects the target's loader asks for and no source stores, made
	 * with the value None, one per layer (megatron-core's linear
	 * layers' _extra_state); NULL-terminated, or NULL. */
	const char *const *objects;
	const rs_family_info *info;     /* the file it came from */
} rs_family;

/* The architecture as far as the checkpoint and the user tell it (0 /
 * false / NAN: unknown). */
typedef struct {
	const rs_family *family;        /* the bridge's, NULL: none */
	const char *family_name;        /* the reader's ("opt"), or NULL:
					 * no description */
	const char *from;               /* what said so ("cfg"), for messages */
	uint32_t layers, hidden, ffn, heads;
	uint32_t kv_heads, head_dim;    /* query groups; rows per head */
	uint64_t vocab;                 /* of the whole model, all TP parts,
					 * without padding */
	uint64_t max_positions;         /* positions the model takes */
	uint64_t position_rows;         /* rows of the position table (metaseq
					 * and HF OPT: max_positions + 2) */
	uint32_t source_tp;             /* model parts in SOURCE */
	double norm_eps, rope_theta;    /* RMSNorm epsilon, RoPE base */
	bool pre_norm;                  /* layer norm before each block */
	bool final_norm;                /* a final layer norm after the last */
	bool tied;                      /* output projection = embeddings */
	bool fused_qkv;                 /* stored as one [k; v; q] per part */
	bool embed_scaled;              /* embeddings times sqrt(hidden)
					 * (metaseq without
					 * no_scale_embedding) */
	rs_dtype dtype;                 /* of the weights */
	char activation[32];            /* "relu", "gelu", ... */
	/* -o hf_config=FILE's text (a JSON object), whose other fields the
	 * hf view copies into config.json; NULL when not given. */
	char *hf_config;
	/* The bridge's config.json for the hf view (owned), and what it
	 * says of each fact's source, a line each (owned), for --dry-run. */
	char *hf_config_out;
	char *fact_lines;
	/* The reader's tensors are under HF transformers names already (a
	 * DeepSpeed save of an HF model): the hf view writes them as they
	 * are, with hf_config_out (the source's config.json, read from
	 * hf_config_from) and no family. */
	bool hf_names;
	char *hf_config_from;
	/* The families the bridge loaded (owned: rs_families_free). */
	struct rs_families *families;
	/* With family_name NULL: why the reader could not describe the model (its
	 * one line; empty when it has no record of the architecture). */
	char why[640];
} rs_model_config;

/* The families loaded (formats/bridge/family.h); freed with the model. */
struct rs_families;
void rs_families_free(struct rs_families *fs);

/* The op of a name as rules files spell it ("same", "qkv_q", ...) and
 * back; -1 / NULL when there is none. */
int rs_map_op_from_name(const char *s);
const char *rs_map_op_name(rs_map_op op);

/* The sources an op takes. */
int rs_map_op_sources(rs_map_op op);

void rs_model_config_free(rs_model_config *m);

#endif
