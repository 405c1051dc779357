/* safetensors: HF safetensors files, single or sharded with
 * model.safetensors.index.json (docs/FORMATS.md, "safetensors"), as a SOURCE and as a view.
 *
 * Reader.  The tensors are those of every `*.safetensors` file at the top
 * of SOURCE or, when `model.safetensors.index.json` is there, of exactly
 * the files its "weight_map" names (a file name, or a relative path beneath
 * SOURCE; other top-level `*.safetensors` files - a `consolidated.` copy,
 * say - are then left out of the view, as vLLM does).  Each tensor is one
 * catalog tensor with one C-order fragment at its absolute file offset.
 * Every other file and directory is passed through; the index and the
 * tensor files are not (the view writes its own).  The `__metadata__` maps
 * of the files are kept for the view (merged, files taken in name order,
 * the first value of a key winning).  Per-rank files that repeat names
 * (vLLM sharded_state, TRT-LLM rank<r>) are refused as a source.
 *
 * Each file is checked as strictly as the reference parser (ST
 * `tensor.rs`), and a little more: an 8-byte little-endian header length N
 * with N <= 100,000,000 and 8+N <= the file's size; a header that is UTF-8
 * and one JSON object with no key given twice (at any level read); entries
 * {"dtype", "shape", "data_offsets": [b, e]} with at most 8 axes of
 * non-negative integers below 2^53; "__metadata__" a map of strings;
 * dtypes BOOL U8 I8 I16 I32 I64 F16 BF16 F32 F64 F8_E4M3 F8_E5M2 (U16,
 * U32, U64 and any other are refused: no rs_dtype holds them); ranges,
 * sorted, contiguous from 0 with no hole or overlap; e-b == numel*size
 * (overflow checked); the last range ending at the end of the file.  The
 * index must be a JSON object with a "weight_map" of strings; each file it
 * names must exist; every tensor it lists must be in the file it names and
 * every tensor of a file must be listed for that file.  Without an index,
 * a tensor in two files is refused.  Every refusal is one line naming the
 * file (and tensor) and the problem; the reader then returns -EINVAL.
 *
 * View.  Per-rank files at the layout's TP:
 *   - tp == 1: `model.safetensors`, what HF transformers and vLLM's default
 *     loader read;
 *   - tp > 1: `model-rank-<r>-part-0.safetensors`, r = 0..tp-1, all at the
 *     top: the names of vLLM's (and SGLang's) `sharded_state` load format
 *     (ShardedStateLoader.DEFAULT_PATTERN), next to the passed-through
 *     config.json and tokenizer files as its save_sharded_state writes them.
 *     (That loader matches keys to vLLM's own parameters, which fuse q/k/v
 *     and gate/up for Llama; the keys here are the source's.)
 * Each file holds every tensor of the catalog under its own name: a TP-split
 * tensor as rank r's shard (on the target grid, the chunks along the TP axis
 * whose index is r mod tp, concatenated in order: a gated fc1's [W_r; V_r]),
 * any other tensor whole.  Header and order are those of the reference
 * writer (safetensors.save_file): compact JSON, "__metadata__" first (the
 * source's, else {}, with "format": "pt" added when absent), tensors sorted
 * by dtype alignment descending then name, padded with spaces to a multiple
 * of 8.  dtypes are the view's (-o dtype=).  Data is served through plans:
 * straight from the source where contiguous.  Byte items (ShardedObjects)
 * have no safetensors form and are left out; a dist checkpoint's
 * metadata.json is left out too (the view is not one); every other file of
 * SOURCE is passed through.
 */
#ifndef RS_SAFETENSORS_H
#define RS_SAFETENSORS_H

#include "formats/checkpoint.h"

/* The safetensors row of the format table. */
extern const rs_format_def rs_safetensors_format;

/* hf view (a view only, -o format=hf; formats/safetensors/hf.c): an HF
 * transformers model directory of a checkpoint whose reader knows the
 * architecture (ck->model, a family of formats/model.c).  At the top:
 *   config.json   the family's HF config (OPT: OPTConfig from cfg -
 *                 layers, hidden, ffn, heads, max positions, vocab from
 *                 the embeddings, pre/post norm, the final layer norm,
 *                 tied output projection, activation, torch_dtype the
 *                 view's dtype);
 *   model.safetensors, or past 5 GB of data HF's sharded form
 *                 (model-0000k-of-0000n.safetensors and
 *                 model.safetensors.index.json): every tensor under the
 *                 family table's HF name, the ones it drops left out
 *                 (decoder.version; a tied output projection, which HF
 *                 ties itself);
 *   SOURCE's other files (vocab.json, merges.txt, dict.txt), passed
 *                 through.
 * Only at tp 1 (one model).  Refused, one line each: no architecture
 * known, a tensor the table has no name for, what the family's HF model
 * cannot express (OPT: scaled embeddings, an unknown activation). */
extern const rs_format_def rs_hf_format;

#endif
