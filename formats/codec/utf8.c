/* UTF-8 validation (formats/codec/utf8.h). */
#include "formats/codec/utf8.h"

bool rs_utf8_valid(const char *str, size_t len, bool surrogates)
{
	const unsigned char *s = (const unsigned char *)str;

	for (size_t i = 0; i < len;) {
		unsigned c = s[i];
		unsigned lo = 0x80, hi = 0xBF;
		size_t n;

		if (c < 0x80) {
			i++;
			continue;
		}
		/* The second byte's range rules out overlong forms (E0, F0),
		 * surrogates (ED, unless asked for) and code points past U+10FFFF (F4). */
		if (c >= 0xC2 && c <= 0xDF)
			n = 1;
		else if (c >= 0xE0 && c <= 0xEF)
			n = 2, lo = c == 0xE0 ? 0xA0 : 0x80,
			hi = c == 0xED && !surrogates ? 0x9F : 0xBF;
		else if (c >= 0xF0 && c <= 0xF4)
			n = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
		else
			return false;
		if (len - i <= n || s[i + 1] < lo || s[i + 1] > hi)
			return false;
		for (size_t k = 2; k <= n; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return false;
		i += n + 1;
	}
	return true;
}
