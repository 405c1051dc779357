/* The group's extent checksum (fs/checksum.h) is XXH64 with seed 0: its
 * values on the published test strings, and on a longer buffer at every
 * tail length, against values from the reference implementation (python
 * xxhash 3.x, computed once and written here). */
#include <string.h>

#include "fs/checksum.h"
#include "tests/unit/check.h"

int main(void)
{
	static const struct {
		const char *s;
		uint64_t want;
	} vectors[] = {
		{ "", 0xef46db3751d8e999ull },
		{ "a", 0xd24ec4f1a98c6e5bull },
		{ "abc", 0x44bc2cf5ad770999ull },
		{ "message digest", 0x066ed728fceeb3beull },
		{ "abcdefghijklmnopqrstuvwxyz", 0xcfe1f278fa89835cull },
		{ "1234567890123456789012345678901234567890"
		  "1234567890123456789012345678901234567890",
		  0xe04a477f19ee145dull },
	};
	static uint8_t big[9472];

	for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++)
		CHECK(rs_checksum64(vectors[i].s, strlen(vectors[i].s)) ==
		      vectors[i].want);
	/* bytes(range(256)) * 37: the 32-byte stripes and every tail. */
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)i;
	CHECK(rs_checksum64(big, sizeof(big)) == 0x88a715c4bc53fcb4ull);
	/* One flipped bit anywhere changes it. */
	for (size_t i = 0; i < sizeof(big); i += 97) {
		big[i] ^= 0x40;
		CHECK(rs_checksum64(big, sizeof(big)) != 0x88a715c4bc53fcb4ull);
		big[i] ^= 0x40;
	}
	return CHECK_DONE();
}
