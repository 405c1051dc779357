/* utf8: whether bytes are UTF-8, as the readers of the formats decide.
 *
 * safetensors headers are Rust str (str::from_utf8: no overlong forms,
 * no surrogates, nothing past U+10FFFF); pickled str values are decoded
 * by Python's unpickler with "surrogatepass", which takes the UTF-8
 * spelling of a lone surrogate (ED A0 80 .. ED BF BF) and nothing else
 * that is not UTF-8.  A reader refuses what its loader would refuse, so a
 * name never means one thing to reshardfs and another to the loader.
 */
#ifndef RS_UTF8_H
#define RS_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Whether s[0, len) is UTF-8; `surrogates` also accepts encoded
 * surrogates (Python's surrogatepass). */
bool rs_utf8_valid(const char *s, size_t len, bool surrogates);

#endif
