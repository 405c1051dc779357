/* model: what a checkpoint says of its model's architecture, and the
 * tables that rename its tensors between ecosystems (metaseq, HF
 * transformers, and next Megatron), one table per model family.
 *
 * A reader that knows the architecture (the metaseq reader, from cfg)
 * fills ck->model; a view that writes another ecosystem's files (the hf
 * view, formats/safetensors/hf.c) takes the family's table from here and
 * the hyperparameters for its config.  Data, not code: a family is a row
 * of rs_families (formats/model.c) with its name pairs; a pattern's '#'
 * stands for a layer number (decimal digits) and comes back the same in
 * the other name.
 *
 * Ownership: rs_model_config holds no pointers it owns (strings are
 * static or in fixed arrays).  Functions return 0 or a negative errno.
 */
#ifndef RS_MODEL_H
#define RS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/dtype.h"

/* One pair of a family's table: the source ecosystem's name and the
 * target's (NULL: the tensor has no place there and is left out, as
 * metaseq's decoder.version is in HF).  `when` limits a pair to models
 * with (RS_WHEN_TIED) or without (RS_WHEN_UNTIED) a tied output
 * projection. */
typedef enum { RS_WHEN_ALWAYS = 0, RS_WHEN_TIED, RS_WHEN_UNTIED } rs_when;

typedef struct {
	const char *from, *to;
	rs_when when;
} rs_name_pair;

typedef struct rs_family {
	const char *name;               /* "opt" */
	const char *from;               /* the source ecosystem: "metaseq" */
	const char *to;                 /* "hf" */
	const rs_name_pair *pairs;      /* ends with from == NULL */
} rs_family;

/* The architecture as far as a reader knows it (0 / false: unknown). */
typedef struct {
	const rs_family *family;        /* NULL: no description */
	const char *from;               /* what said so ("cfg"), for messages */
	uint32_t layers, hidden, ffn, heads;
	uint64_t vocab;                 /* of the whole model, all TP parts */
	uint64_t max_positions;         /* positions the model takes */
	uint64_t position_rows;         /* rows of the position table (metaseq
					 * and HF OPT: max_positions + 2) */
	uint32_t source_tp;             /* model parts in SOURCE */
	bool pre_norm;                  /* layer norm before each block */
	bool final_norm;                /* a final layer norm after the last */
	bool tied;                      /* output projection = embeddings */
	bool fused_qkv;                 /* stored as one [k; v; q] per part */
	bool embed_scaled;              /* embeddings times sqrt(hidden)
					 * (metaseq without
					 * no_scale_embedding) */
	rs_dtype dtype;                 /* of the weights */
	char activation[32];            /* "relu", "gelu", ... */
	/* With family NULL: why the reader could not describe the model (its
	 * one line; empty when it has no record of the architecture). */
	char why[640];
} rs_model_config;

/* The family of `name` for source ecosystem `from` and target `to`, or
 * NULL. */
const rs_family *rs_family_find(const char *name, const char *from,
				const char *to);

/* Renames `name` by family f's table into out[size]: 1 when renamed,
 * 0 when the table drops it (a NULL target), -ENOENT when no pair
 * matches, -ENAMETOOLONG when out is too small. */
int rs_family_rename(const rs_family *f, bool tied, const char *name,
		     char *out, size_t size);

#endif
