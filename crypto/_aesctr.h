/* AES-128-CTR of our own (AES-NI; VAES on 256- or 512-bit registers where the CPU has it), its
 * keystream added into ring words as it is produced (issue #24). See _aesctr.c. */
#ifndef SPHERECAL_AESCTR_H
#define SPHERECAL_AESCTR_H

#include <stddef.h>
#include <stdint.h>

enum {
    AESCTR_OPENSSL = 0,
    AESCTR_AESNI = 1,
    AESCTR_VAES = 2,
    AESCTR_VAES512 = 3,
    AESCTR_ENGINES = 4
};

/* Which engines this CPU runs (bit i set: engine i); AESCTR_OPENSSL always. */
unsigned aesctr_supported(void);

/* Whether `blocks` blocks from each 16-byte counter block stay within its low 32-bit
 * word (no carry into the nonce): the own engines count in 32 bits, OpenSSL in 128. */
int aesctr_no_carry(const unsigned char *counters, size_t m, size_t blocks);

/* target = (source or target) + sum_i signs[i] * AES-128-CTR(keys[i], counters[i]) in
 * little-endian words of `word` (4 or 8) bytes, wrapping; nbytes a multiple of word.
 * The engine must be supported and aesctr_no_carry must hold. No allocation, no
 * Python: runs with the GIL released. */
void aesctr_apply(int engine, unsigned char *target, const unsigned char *source,
                  size_t nbytes, int word, const unsigned char *keys,
                  const unsigned char *counters, const signed char *signs, size_t m);

/* out = the first nbytes of AES-128-CTR(key, counter) (the bare keystream). */
void aesctr_keystream(int engine, unsigned char *out, size_t nbytes, const unsigned char *key,
                      const unsigned char *counter);

#endif
