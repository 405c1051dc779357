/* layout: the requested parallel layout, resolved per tensor.
 *
 * rs_layout_resolve decides, for every tensor of a catalog, the shape and
 * chunk grid it has in the view (docs/ARCHITECTURE.md, "Layout semantics"):
 *
 *  - TP.  A split axis stored with fragmentation f under source TP s has
 *    fragmentation f/s*tp in the view.  f/s is the multiplier m (2 for a
 *    gated fc1, which stores [W; V] as 2*tp chunks).  The source TP is
 *    `src_tp` when given, else the smallest fragmentation of any split axis
 *    of a tensor on a regular grid.  A tensor whose fragments lie off any
 *    grid (FSDP pieces) is taken as merged: multiplier 1, tp parts.
 *  - Vocab.  The padded size is ceil(V/(div*tp))*div*tp when vocab_size V is
 *    given; otherwise the stored padded size, which must then divide by tp.
 *    Rows past the stored ones read as zeros (no fragment covers them).
 *  - PP changes no names in dist checkpoints; it is validated against the
 *    layer count.
 *  - Experts.  A rule with an expert axis marks a Mixture-of-Experts
 *    weight.  Its expert axis is cut one expert per chunk, as
 *    megatron-core's expert layers (sequential or grouped) cut it in a
 *    sharded state dict; an EP rank owns experts/ep consecutive ones, so
 *    ep must divide the expert count (the refusal lists the ep values
 *    that do).  Its TP axis is split as above but by etp, the expert TP,
 *    from a source expert TP inferred the same way.
 *  - Every other axis keeps its stored chunking.
 *  - dtype.  With opts.dtype set, every floating-point tensor is shown in
 *    that type (converted on read); other tensors keep theirs.
 *
 * Any split that does not divide evenly, or any inconsistency, is reported
 * to the diag list naming the tensor, the axis and the sizes; the function
 * then returns -EINVAL after checking every tensor.
 */
#ifndef RS_LAYOUT_H
#define RS_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "planner/catalog.h"
#include "planner/diag.h"
#include "planner/rules.h"

#define RS_DEFAULT_VOCAB_DIVISOR 128
/* The most ranks a layout may spread experts over (ep x etp), as the
 * options bound tp: a view may write a file per rank. */
#define RS_LAYOUT_MAX_RANKS (1u << 20)

/* The key form of expert weights in a per-rank megatron view (-o
 * experts=): the source's, SequentialMLP's, or TEGroupedMLP's. */
typedef enum {
	RS_EXPERT_KEYS_SOURCE = 0,
	RS_EXPERT_KEYS_SEQUENTIAL,
	RS_EXPERT_KEYS_GROUPED,
} rs_expert_keys;

typedef struct {
	uint32_t tp;            /* 0: the source's own */
	uint32_t pp;            /* 0: not given */
	uint32_t vpp;           /* virtual pipeline chunks per stage; 0: 1
				 * (legacy per-rank views only) */
	uint32_t ep;            /* expert-parallel ranks; 0: not given (1) */
	uint32_t etp;           /* expert TP; 0: the view's tp, as
				 * megatron-core defaults it */
	rs_expert_keys expert_keys; /* per-rank megatron views */
	uint32_t src_tp;        /* 0: infer from the stored grid */
	uint64_t vocab_size;    /* 0: keep the stored padded size */
	uint32_t vocab_divisor; /* 0: RS_DEFAULT_VOCAB_DIVISOR */
	rs_dtype dtype;         /* floating-point tensors shown as this;
				 * RS_DTYPE_INVALID: as stored */
	uint64_t shard_size;    /* views that cut their weights into files
				 * (hf): the most data bytes per file; 0:
				 * the view's default */
} rs_layout_opts;

typedef struct {
	bool has_rule;          /* a rule (built-in or user) matched */
	rs_split split;
	int axis;               /* absolute axis split by TP (-1: none) */
	int expert_axis;        /* absolute axis numbering experts (-1:
				 * not an expert weight) */
	int64_t expert;         /* a per-expert key's global expert (its
				 * rule's expert_key); -1: none */
	bool by_etp;            /* axis, multiplier and chunk count the
				 * expert TP (etp) ranks, not tp's */
	uint32_t multiplier;
	uint64_t shape[RS_MAX_DIMS];
	uint64_t chunk[RS_MAX_DIMS];   /* the whole shape for an irregular
					 * tensor (one chunk) */
	rs_dtype dtype;         /* in the view: the stored one, or
				 * rs_layout_opts.dtype for floating-point
				 * tensors */
	bool changed;           /* shape, chunks or dtype differ from the
				 * stored */
} rs_target;

typedef struct {
	uint32_t src_tp;
	uint32_t tp;
	uint32_t pp;
	uint32_t vpp;           /* 1 unless given */
	bool pp_given, vpp_given; /* per-rank views keep the source's
				   * pipeline layout otherwise */
	uint32_t ep;            /* expert-parallel ranks (1 unless given) */
	uint32_t etp, src_etp;  /* expert TP of the view and of the source
				 * (inferred like src_tp from the expert
				 * weights' grids; src_tp when none) */
	bool ep_given;
	rs_expert_keys expert_keys; /* opts.expert_keys */
	uint64_t experts;       /* experts per MoE layer (the expert axis'
				 * size, alike on every expert weight, or
				 * one past the highest expert a per-expert
				 * key names); 0: no expert weight */
	uint64_t layers;        /* 0 when no layer count was found */
	rs_dtype dtype;         /* opts.dtype: INVALID when as stored */
	uint64_t shard_size;    /* opts.shard_size */
	rs_target *targets;     /* one per catalog tensor, same order */
	size_t count;
} rs_layout;

int rs_layout_resolve(const rs_catalog *c, const rs_rules *rules,
		      const rs_layout_opts *opts, rs_layout *out, rs_diag *d);
void rs_layout_free(rs_layout *l);

/* The TP degree a target's split axis is cut by: etp for expert
 * weights, tp for the rest. */
static inline uint32_t rs_layout_tp_of(const rs_layout *l,
				       const rs_target *tg)
{
	return tg->by_etp ? l->etp : l->tp;
}

/* One TP rank's shard of a target, as a per-rank view stores it: the
 * target's shape with the split axis (if any) chunk x multiplier long,
 * the rank's `multiplier` pieces side by side. */
void rs_target_shard_shape(const rs_target *tg, uint64_t shape[RS_MAX_DIMS]);

/* Where piece j (< multiplier) of TP rank r's shard starts along the
 * split axis of the tensor: pieces of all ranks interleave, rank-major
 * within each of the multiplier groups (fused gate/up, q/k/v groups). */
static inline uint64_t rs_target_piece_offset(const rs_target *tg,
					      uint32_t tp, uint32_t r,
					      uint32_t j)
{
	return ((uint64_t)j * tp + r) * tg->chunk[tg->axis];
}

/* ceil(v / (div*tp)) * div*tp, or 0 on overflow. */
uint64_t rs_padded_vocab(uint64_t v, uint32_t div, uint32_t tp);

#endif
