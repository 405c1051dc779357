/* facts: what a checkpoint's own records say of its model beyond the
 * tensor shapes - Megatron's saved args (a legacy rank file's, a dist
 * checkpoint's common.pt) and an HF config.json - read by one table
 * (formats/facts.c) that names each fact's field in both ecosystems and
 * the values it may take.
 *
 * Every value is checked before it is narrowed or trusted: a count must be
 * an integer in its range, a real number finite and in its range, a bool a
 * bool, a text a str.  Absent (or None / null) is unknown; anything else
 * that is not such a value refuses the checkpoint with one line naming the
 * record, the field and the value.  Texts are copied whole, whatever
 * their length: a fact is never cut short into "unknown".
 *
 * Ownership: rs_model_facts owns its texts (rs_facts_free).  Functions
 * return 0, -EINVAL after reporting, or -ENOMEM.
 */
#ifndef RS_FACTS_H
#define RS_FACTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "formats/codec/pickle.h"
#include "planner/diag.h"

/* 0 (NAN for the reals, -1 for the tri-states, NULL for the texts) where
 * unknown.  The layout refuses a TP that would cut a query group; the
 * bridge (formats/bridge/bridge.h) takes the rest for an HF config.json. */
typedef struct {
	uint32_t heads;         /* attention heads */
	uint32_t query_groups;  /* GQA query groups (KV heads); heads for MHA */
	uint32_t head_dim;      /* kv_channels */
	uint64_t vocab;         /* the true vocab (args.vocab_size) */
	uint64_t max_positions;
	double norm_eps, rope_theta;
	int tied;               /* output layer shares the embeddings */
	int gated;              /* swiglu */
	char *normalization;    /* "RMSNorm", "LayerNorm" */
	char *position;         /* position_embedding_type: "rope", ... */
	const char *from;       /* which record said so, for messages */
	/* The whole record as JSON, for the family files' config facts
	 * (formats/bridge/family.h): Megatron's args' fields of plain values
	 * (numbers, bools, texts, lists of them; None left out), or a copy
	 * of config.json.  Owned; NULL when nothing is known. */
	cJSON *record;
} rs_model_facts;

/* All unknown. */
void rs_facts_init(rs_model_facts *f);
void rs_facts_free(rs_model_facts *f);

/* Megatron's args (an argparse.Namespace's state dict) into *f:
 * num_attention_heads, num_query_groups when group_query_attention is
 * set (else the heads), kv_channels, vocab_size, max_position_embeddings,
 * norm_epsilon, rotary_base, untie_embeddings_and_output_weights, swiglu,
 * normalization and position_embedding_type.  Nothing is known when
 * num_attention_heads is not.  `from` names the record in later messages
 * ("args"), `where` is its file.  *f is replaced only on success. */
int rs_facts_from_args(rs_model_facts *f, const rs_pvalue *args,
		       const char *from, const char *where, rs_diag *d);

/* An HF config.json object into *f: num_attention_heads,
 * num_key_value_heads (default: the heads), head_dim, vocab_size,
 * max_position_embeddings, rms_norm_eps, rope_theta, tie_word_embeddings.
 * Nothing is known when num_attention_heads is not.  `where` names the
 * file.  *f is replaced only on success. */
int rs_facts_from_hf(rs_model_facts *f, const cJSON *cfg, const char *where,
		     rs_diag *d);

/* Field `field` of an HF config object (a JSON object of LlamaConfig
 * fields: -o hf_config=, config.json), checked as the table checks it
 * (fields the table does not know: a finite non-negative number; a bool
 * reads as 0 or 1): 1 with *out set, 0 when absent or null, -EINVAL
 * reported naming `where`. */
int rs_facts_hf_number(const cJSON *cfg, const char *field,
		       const char *where, double *out, rs_diag *d);

/* The first fact of Megatron's args on which a and b disagree (one of
 * them not knowing it counts): its args field and both values as text
 * (buffers of `size`); false when they agree. */
bool rs_facts_differ(const rs_model_facts *a, const rs_model_facts *b,
		     const char **field, char *va, char *vb, size_t size);

#endif
