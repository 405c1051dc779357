/* json_text: edit a JSON object's text without re-serialising it.
 *
 * A view rewrites `.zarray` files by replacing the values of a few top-level
 * keys ("chunks", "shape") and keeping every other byte as stored, so
 * fields reshardfs does not know survive exactly.  The text must already
 * have been validated as JSON (cJSON_Parse); these functions are still
 * bounds-safe on any input.
 */
#ifndef RS_JSON_TEXT_H
#define RS_JSON_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Parses `text` as one JSON object the way Python's json.loads would read
 * it, or refuses it: cJSON alone would accept bytes after the object and
 * a NUL inside a string (cut short), and keep the FIRST of two equal keys
 * where Python keeps the last - so a hostile file could mean one thing to
 * reshardfs and another to the loader reading the view.  On success *out
 * is the object (cJSON_Delete it).  On failure returns -EINVAL with a
 * short reason in `why` ("not a JSON object", "duplicate key \"k\"", ...)
 * or -ENOMEM. */
int rs_json_parse_object(const char *text, size_t len, cJSON **out,
			 char *why, size_t why_size);

/* A key given twice in the object `obj` (*dup; NULL when there is none):
 * Python's json and serde keep the last (or, in a safetensors entry,
 * refuse it), cJSON finds the first, so readers refuse it rather than
 * read a file differently from its loaders.  0 or -ENOMEM. */
int rs_json_duplicate_key(const cJSON *obj, const char **dup);

/* Whether v is a JSON number that is a whole non-negative integer no
 * larger than 2^53 (*out set): JSON numbers are doubles, and above 2^53
 * not every integer has one, so a larger one may not be what was written. */
bool rs_json_u64(const cJSON *v, uint64_t *out);

/* The first number of the JSON text written as a fraction or with an
 * exponent (`3.0`, `4.8e1`): its offset, or SIZE_MAX when every number is
 * an integer literal.  Formats whose readers take only integers (serde's
 * usize, as safetensors has) refuse such a text though cJSON reads 3.0 as
 * 3.  The text must be valid JSON. */
size_t rs_json_first_fraction(const char *text, size_t len);

/* Byte span [*start, *end) of the value of top-level key `key`.
 * Returns 0, or -ENOENT when the key is absent, -EINVAL on bad text. */
int rs_json_value_span(const char *text, size_t len, const char *key,
		       size_t *start, size_t *end);

/* Formats an integer list the way the stored value `old` (a JSON array's
 * text) was formatted: one item per line with the same indentation when it
 * spanned lines (as Python's json.dumps(indent=N) writes), else inline with
 * the same separator.  Returns a malloc'd string or NULL. */
char *rs_json_format_like(const char *old, size_t old_len,
			  const uint64_t *v, int n);

/* Returns a malloc'd copy of `text` in which the value of each key in
 * keys[0..n) is replaced by the matching list, formatted like the stored
 * value.  *out_len receives the length.  -ENOENT if a key is absent. */
int rs_json_replace_lists(const char *text, size_t len, const char **keys,
			  const uint64_t *const *values, const int *counts,
			  int n, char **out, size_t *out_len);

/* The same with replacement texts given as they are (JSON already):
 * values[i] replaces the value of keys[i]. */
int rs_json_replace_values(const char *text, size_t len, const char **keys,
			   const char *const *values, int n, char **out,
			   size_t *out_len);

#endif
