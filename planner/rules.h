/* rules: how each tensor is split by tensor parallelism.
 *
 * A rule matches a tensor by a glob on its *base name*: the key with an
 * `optimizer.state.<state>.` prefix and then a `model.` prefix removed, so
 * one rule covers a parameter, its NeMo spelling and its optimizer states.
 * `*` matches any run of characters (including dots); nothing else is
 * special.
 *
 * Split kinds:
 *   RS_SPLIT_NONE    replicated (or unknown): the stored grid is kept;
 *   RS_SPLIT_AXIS    TP splits axis `axis` (counted after the layer axes);
 *   RS_SPLIT_VOCAB   like AXIS 0, and the axis is re-padded (see layout.h).
 *
 * Experts: a rule may name the axis that numbers a Mixture-of-Experts
 * layer's experts (`expert_axis`, after the layer axes), or, for keys of
 * one expert each, the text its number follows in the name
 * (`expert_key`), and say that its split is by expert tensor parallelism
 * (`etp`), which a job sets apart from the dense TP (planner/layout.h).
 *
 * Layer axes: Megatron stacks homogeneous layers into leading axes.  A rule
 * may say how many (`layer_axes`), else it is inferred from the base name:
 * `decoder.layers.` followed by a non-digit means one stacked layer axis.
 *
 * User rules (rs_rules_load_json) are tried before the built-ins; the first
 * match wins.  JSON schema, documented in reshardfs(1):
 *   {"rules": [{"match": "<glob>",
 *               "split": "column"|"row"|"vocab"|"replicated",
 *               "axis": <int, instead of split>,
 *               "layer_axes": <int, optional>,
 *               "expert_axis": <int, optional>,
 *               "etp": <bool, optional>,
 *               "expert_key": <string, optional>}, ...]}
 */
#ifndef RS_RULES_H
#define RS_RULES_H

#include <stdbool.h>
#include <stdint.h>

#include "planner/diag.h"

/* Axes a rule may name; tensors have at most RS_MAX_DIMS (8) axes. */
#define RS_RULE_MAX_AXIS 8
/* The longest expert_key a rules file may give. */
#define RS_RULE_KEY_MAX 200

typedef enum {
	RS_SPLIT_NONE = 0,
	RS_SPLIT_AXIS,
	RS_SPLIT_VOCAB,
} rs_split;

typedef struct {
	char *match;      /* glob on the base name */
	rs_split split;
	int axis;         /* with RS_SPLIT_AXIS/VOCAB, after the layer axes */
	int layer_axes;   /* -1: infer from the name */
	int expert_axis;  /* after the layer axes, the axis numbering the
			   * experts of a Mixture-of-Experts weight; -1: none */
	bool etp;         /* the split is by expert TP (-o etp=), not TP */
	char *expert_key; /* per-expert keys: the global expert's number
			   * follows this text in the name; NULL: none */
} rs_rule;

typedef struct rs_rules rs_rules;

/* A rule set holding the built-in Megatron-core GPT/Llama rules. */
int rs_rules_new(rs_rules **out);
void rs_rules_free(rs_rules *r);

/* Adds the rules of a JSON file, ahead of the built-ins.  On a malformed
 * file, reports "<path>: <problem>" to d and returns -EINVAL. */
int rs_rules_load_json(rs_rules *r, const char *path, rs_diag *d);

/* The base name of a key (a pointer into `key`). */
const char *rs_rules_base_name(const char *key);

/* The stacked layer axes inferred from `key`'s base name (no rule asked). */
int rs_rules_layer_axes(const char *key);

/* The rule for `key`, or NULL when no rule knows it.  *layer_axes receives
 * the number of stacked layer axes (from the rule or inferred). */
const rs_rule *rs_rules_match(const rs_rules *r, const char *key,
			      int *layer_axes);

/* The expert a per-expert key names (the decimal number, at most 9
 * digits, between r->expert_key and the next '.' of the key's base
 * name), or -1 when r has no expert_key or the name holds none. */
int64_t rs_rule_expert_of_name(const rs_rule *r, const char *key);

/* Glob match with '*' only; exposed for tests. */
bool rs_glob_match(const char *pattern, const char *s);

#endif
