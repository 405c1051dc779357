/* hf_llama_catalog: a small HF Llama's tensors as a catalog, for the
 * bridge's unit test and fuzz target - L layers, 4 heads in 2 groups of 2
 * rows, hidden 8, ffn 6, vocab 10; each tensor one C-order fragment in a
 * source of its own (its index), at offset 4096.
 */
#ifndef RS_TEST_HF_LLAMA_CATALOG_H
#define RS_TEST_HF_LLAMA_CATALOG_H

#include <stdio.h>

#include "planner/catalog.h"

enum { HFL_H = 4, HFL_G = 2, HFL_D = 2, HFL_HID = 8, HFL_FFN = 6, HFL_V = 10 };

/* Tensor `name` of [rows, cols] ([rows] when cols is 0): 0, or what
 * rs_catalog_add_fragments returned. */
static inline int hfl_add(rs_catalog *c, const char *name, rs_dtype dt,
			  uint64_t rows, uint64_t cols)
{
	uint64_t shape[2] = { rows, cols };
	int nd = cols ? 2 : 1;
	size_t i;
	int err = rs_catalog_add_fragments(c, name, dt, nd, shape, 1, &i);

	if (err)
		return err;
	c->tensors[i].frags[0].box.ndim = nd;
	c->tensors[i].frags[0].box.len[0] = rows;
	c->tensors[i].frags[0].box.len[1] = cols;
	c->tensors[i].frags[0].stride[0] = cols ? cols : 1;
	c->tensors[i].frags[0].stride[1] = 1;
	c->tensors[i].frags[0].source = (uint32_t)i;
	c->tensors[i].frags[0].offset = 4096;
	return 0;
}

/* The per-layer tensors, in the order hfl_catalog adds them. */
#define HFL_PER_LAYER 9

/* The model of `layers` layers, all float32 but tensor `odd` (0 to
 * HFL_PER_LAYER - 1, in the order below) of the last layer, which is
 * float16 (odd >= HFL_PER_LAYER: none).  0, or the first error. */
static inline int hfl_catalog(rs_catalog *c, unsigned layers, unsigned odd)
{
	static const struct {
		const char *what;
		uint64_t rows, cols;
	} t[HFL_PER_LAYER] = {
		{ "self_attn.q_proj.weight", HFL_H * HFL_D, HFL_HID },
		{ "self_attn.k_proj.weight", HFL_G * HFL_D, HFL_HID },
		{ "self_attn.v_proj.weight", HFL_G * HFL_D, HFL_HID },
		{ "self_attn.o_proj.weight", HFL_HID, HFL_H * HFL_D },
		{ "mlp.gate_proj.weight", HFL_FFN, HFL_HID },
		{ "mlp.up_proj.weight", HFL_FFN, HFL_HID },
		{ "mlp.down_proj.weight", HFL_HID, HFL_FFN },
		{ "input_layernorm.weight", HFL_HID, 0 },
		{ "post_attention_layernorm.weight", HFL_HID, 0 },
	};
	char n[128];
	int err = hfl_add(c, "model.embed_tokens.weight", RS_DTYPE_F32, HFL_V,
			  HFL_HID);

	if (!err)
		err = hfl_add(c, "lm_head.weight", RS_DTYPE_F32, HFL_V, HFL_HID);
	if (!err)
		err = hfl_add(c, "model.norm.weight", RS_DTYPE_F32, HFL_HID, 0);
	for (unsigned l = 0; l < layers && !err; l++)
		for (unsigned k = 0; k < HFL_PER_LAYER && !err; k++) {
			snprintf(n, sizeof(n), "model.layers.%u.%s", l, t[k].what);
			err = hfl_add(c, n, l + 1 == layers && k == odd
						    ? RS_DTYPE_F16 : RS_DTYPE_F32,
				      t[k].rows, t[k].cols);
		}
	return err;
}

#endif
