/* XXH64 with seed 0, from its published description; see checksum.h. */
#include "fs/checksum.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl(uint64_t x, int r)
{
	return (x << r) | (x >> (64 - r));
}

/* Little-endian loads through memcpy: any alignment. */
static uint64_t load64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

static uint32_t load32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static uint64_t round64(uint64_t acc, uint64_t in)
{
	acc += in * P2;
	acc = rotl(acc, 31);
	return acc * P1;
}

static uint64_t merge(uint64_t acc, uint64_t v)
{
	acc ^= round64(0, v);
	return acc * P1 + P4;
}

uint64_t rs_checksum64(const void *data, size_t len)
{
	const uint8_t *p = data, *end = p + len;
	uint64_t h;

	if (len >= 32) {
		uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;

		do {
			v1 = round64(v1, load64(p));
			v2 = round64(v2, load64(p + 8));
			v3 = round64(v3, load64(p + 16));
			v4 = round64(v4, load64(p + 24));
			p += 32;
		} while ((size_t)(end - p) >= 32);
		h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
		h = merge(h, v1);
		h = merge(h, v2);
		h = merge(h, v3);
		h = merge(h, v4);
	} else {
		h = P5;
	}
	h += (uint64_t)len;
	for (; end - p >= 8; p += 8)
		h = rotl(h ^ round64(0, load64(p)), 27) * P1 + P4;
	if (end - p >= 4) {
		h = rotl(h ^ ((uint64_t)load32(p) * P1), 23) * P2 + P3;
		p += 4;
	}
	for (; p < end; p++)
		h = rotl(h ^ (*p * P5), 11) * P1;
	h ^= h >> 33;
	h *= P2;
	h ^= h >> 29;
	h *= P3;
	h ^= h >> 32;
	return h;
}
