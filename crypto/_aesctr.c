/* AES-128-CTR of our own, its keystream added into ring words in the AES pipeline.
 *
 * Why (issue #24): with OpenSSL's CTR writing keystream into an L1 buffer and a second
 * loop adding it into the target, masking topped out at 0.85-0.91 of OpenSSL's bare
 * keystream even in C: the adds and the keystream's store and reload are not free. Here
 * each AES state is added into the target word-wise straight from the register
 * (keystream XOR-free: the ring's words are *added*, 64- or 32-bit lanes, as in
 * spherecal.crypto.prg), two masks' rounds interleaved so each target vector is loaded and
 * stored once per pair of masks, a target tile of 8 KiB kept in L1 while every mask is
 * added.
 *
 * Three engines, one body (_aesctr_body.h):
 *   vaes512  512-bit VAES (vaesenc on zmm: four blocks per instruction), AVX-512 adds; 4
 *            vectors per mask, 32 blocks of a mask pair in flight. Where the processor
 *            executes 512-bit VAES at full width it doubles vaes (measured on the 2-core
 *            development machine of 2026-11-26, AMD EPYC with AVX-512: bare keystream
 *            49.6 against 25.2 GB/s, OpenSSL's AES-GCM 22-26 GB/s); where it splits it in
 *            two 256-bit halves it is about vaes;
 *   vaes     256-bit VAES (vaesenc on ymm: two blocks per instruction), AVX2 adds; 4
 *            vectors per mask, 16 blocks of a mask pair in flight;
 *   aesni    128-bit AES-NI, SSE adds; 8 blocks of a mask pair in flight.
 * Each is compiled with a function-level target attribute (no -march flag: the extension
 * builds for any x86-64 and for other architectures without either) and chosen at run
 * time with __builtin_cpu_supports; where none runs, _maskkernel.c keeps OpenSSL's
 * EVP path.
 *
 * The keystream is exactly OpenSSL's AES-128-CTR: block j of a call encrypts the caller's
 * 16-byte counter block plus j. The engines add j to the low 32-bit word only (the v2
 * keystream's counter, spherecal.crypto.prg); a call whose count would carry out of that
 * word (aesctr_no_carry false; never for a v2 segment, whose counters run 2 .. 2^26 + 1)
 * goes to OpenSSL, which carries through all 128 bits.
 *
 * Constant time: AES-NI/VAES have no key- or data-dependent timing, and there is no
 * table-based AES here. The key schedules live on the stack and are cleansed before
 * return (the vector registers cleared: vzeroall, and zmm16-31 by hand after AVX-512
 * code), as are the tail's keystream bytes.
 */
#include "_aesctr.h"

#include <string.h>

#include <openssl/crypto.h>

/* dst = src + sign * ks word by word (sign 0: dst = ks byte by byte), n bytes. */
static void aesctr_add_words(unsigned char *dst, const unsigned char *src,
                             const unsigned char *ks, size_t n, int sign, int word) {
    if (sign == 0) {
        memcpy(dst, ks, n);
        return;
    }
    for (size_t o = 0; o + (size_t)word <= n; o += (size_t)word) {
        if (word == 8) {
            uint64_t s, k;
            memcpy(&s, src + o, 8);
            memcpy(&k, ks + o, 8);
            s = sign > 0 ? s + k : s - k;
            memcpy(dst + o, &s, 8);
        } else {
            uint32_t s, k;
            memcpy(&s, src + o, 4);
            memcpy(&k, ks + o, 4);
            s = sign > 0 ? s + k : s - k;
            memcpy(dst + o, &s, 4);
        }
    }
}

int aesctr_no_carry(const unsigned char *counters, size_t m, size_t blocks) {
    for (size_t i = 0; i < m; i++) {
        const unsigned char *c = counters + 16 * i;
        uint64_t lo = ((uint64_t)c[12] << 24) | ((uint64_t)c[13] << 16) |
                      ((uint64_t)c[14] << 8) | (uint64_t)c[15];
        if (lo + blocks > ((uint64_t)1 << 32)) return 0;
    }
    return 1;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET_AES __attribute__((target("aes,sse4.1")))

TARGET_AES static inline __m128i expand_step(__m128i key, __m128i assist) {
    assist = _mm_shuffle_epi32(assist, 0xff);
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    return _mm_xor_si128(key, assist);
}

/* The AES-128 key schedule (FIPS-197 §5.2) with aeskeygenassist. */
TARGET_AES static void aesctr_expand_key(const unsigned char *key, __m128i rk[11]) {
    rk[0] = _mm_loadu_si128((const __m128i *)key);
#define STEP(i, rcon) rk[i] = expand_step(rk[i - 1], _mm_aeskeygenassist_si128(rk[i - 1], rcon))
    STEP(1, 0x01); STEP(2, 0x02); STEP(3, 0x04); STEP(4, 0x08); STEP(5, 0x10);
    STEP(6, 0x20); STEP(7, 0x40); STEP(8, 0x80); STEP(9, 0x1b); STEP(10, 0x36);
#undef STEP
}

/* ---- vaes: 256-bit, two blocks per vector ---- */
#define SFX vaes
#define TGT __attribute__((target("aes,avx2,vaes")))
#define VEC __m256i
#define BPV 2
#define NS 4
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define VXOR _mm256_xor_si256
#define VADD64 _mm256_add_epi64
#define VSUB64 _mm256_sub_epi64
#define VADD32 _mm256_add_epi32
#define VSUB32 _mm256_sub_epi32
#define VENC _mm256_aesenc_epi128
#define VENCLAST _mm256_aesenclast_epi128
#define VSHUF _mm256_shuffle_epi8
#define VSET1_32 _mm256_set1_epi32
#define VFROM128 _mm256_broadcastsi128_si256
#define VCTR0(lo) _mm256_setr_epi32(0, 0, 0, (int)(lo), 0, 0, 0, (int)((lo) + 1))
#define VBSWAP                                                                          \
    _mm256_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 15, 14, 13, 12, -1, \
                     -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 15, 14, 13, 12)
#define VCLEAR() _mm256_zeroall()
#include "_aesctr_body.h"

/* ---- vaes512: 512-bit VAES, four blocks per vector ---- */
/* The upper sixteen vector registers (zmm16-31, which only AVX-512 code uses and which
 * vzeroall leaves alone) may hold round keys or AES states: cleared by hand. */
#define ZCLR(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
__attribute__((target("avx512f"))) static inline void clear_upper_zmm(void) {
    __asm__ volatile(ZCLR(16) ZCLR(17) ZCLR(18) ZCLR(19) ZCLR(20) ZCLR(21) ZCLR(22)
                         ZCLR(23) ZCLR(24) ZCLR(25) ZCLR(26) ZCLR(27) ZCLR(28) ZCLR(29)
                             ZCLR(30) ZCLR(31)
                     ::: "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
                       "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29",
                       "xmm30", "xmm31");
    _mm256_zeroall();
}
#undef ZCLR
#define SFX vaes512
#define TGT __attribute__((target("aes,avx2,avx512f,avx512bw,vaes")))
#define VEC __m512i
#define BPV 4
#define NS 4
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define VSTORE(p, v) _mm512_storeu_si512((void *)(p), v)
#define VXOR _mm512_xor_si512
#define VADD64 _mm512_add_epi64
#define VSUB64 _mm512_sub_epi64
#define VADD32 _mm512_add_epi32
#define VSUB32 _mm512_sub_epi32
#define VENC _mm512_aesenc_epi128
#define VENCLAST _mm512_aesenclast_epi128
#define VSHUF _mm512_shuffle_epi8
#define VSET1_32 _mm512_set1_epi32
#define VFROM128 _mm512_broadcast_i32x4
#define VCTR0(lo)                                                                        \
    _mm512_setr_epi32(0, 0, 0, (int)(lo), 0, 0, 0, (int)((lo) + 1), 0, 0, 0,             \
                      (int)((lo) + 2), 0, 0, 0, (int)((lo) + 3))
#define VBSWAP                                                                           \
    _mm512_broadcast_i32x4(                                                              \
        _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 15, 14, 13, 12))
#define VCLEAR() clear_upper_zmm()
#include "_aesctr_body.h"

/* ---- aesni: 128-bit, one block per vector ---- */
#define SFX aesni
#define TGT TARGET_AES
#define VEC __m128i
#define BPV 1
#define NS 4
#define VLOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define VSTORE(p, v) _mm_storeu_si128((__m128i *)(p), v)
#define VXOR _mm_xor_si128
#define VADD64 _mm_add_epi64
#define VSUB64 _mm_sub_epi64
#define VADD32 _mm_add_epi32
#define VSUB32 _mm_sub_epi32
#define VENC _mm_aesenc_si128
#define VENCLAST _mm_aesenclast_si128
#define VSHUF _mm_shuffle_epi8
#define VSET1_32 _mm_set1_epi32
#define VFROM128(x) (x)
#define VCTR0(lo) _mm_setr_epi32(0, 0, 0, (int)(lo))
#define VBSWAP _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 15, 14, 13, 12)
#define VCLEAR() ((void)0)
#include "_aesctr_body.h"

unsigned aesctr_supported(void) {
    static unsigned cached;
    if (!cached) {
        unsigned s = 1u << AESCTR_OPENSSL;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1"))
            s |= 1u << AESCTR_AESNI;
        if ((s & (1u << AESCTR_AESNI)) && __builtin_cpu_supports("avx2") &&
            __builtin_cpu_supports("vaes"))
            s |= 1u << AESCTR_VAES;
        if ((s & (1u << AESCTR_VAES)) && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw"))
            s |= 1u << AESCTR_VAES512;
        cached = s;
    }
    return cached;
}

void aesctr_apply(int engine, unsigned char *target, const unsigned char *source,
                  size_t nbytes, int word, const unsigned char *keys,
                  const unsigned char *counters, const signed char *signs, size_t m) {
    if (engine == AESCTR_VAES512)
        apply_vaes512(target, source, nbytes, word, keys, counters, signs, m);
    else if (engine == AESCTR_VAES)
        apply_vaes(target, source, nbytes, word, keys, counters, signs, m);
    else
        apply_aesni(target, source, nbytes, word, keys, counters, signs, m);
}

void aesctr_keystream(int engine, unsigned char *out, size_t nbytes, const unsigned char *key,
                      const unsigned char *counter) {
    if (engine == AESCTR_VAES512)
        keystream_vaes512(out, nbytes, key, counter);
    else if (engine == AESCTR_VAES)
        keystream_vaes(out, nbytes, key, counter);
    else
        keystream_aesni(out, nbytes, key, counter);
}

#else /* not x86-64 with GCC/clang: OpenSSL's EVP path only */

unsigned aesctr_supported(void) { return 1u << AESCTR_OPENSSL; }

void aesctr_apply(int engine, unsigned char *target, const unsigned char *source,
                  size_t nbytes, int word, const unsigned char *keys,
                  const unsigned char *counters, const signed char *signs, size_t m) {
    (void)engine, (void)target, (void)source, (void)nbytes, (void)word, (void)keys;
    (void)counters, (void)signs, (void)m, (void)aesctr_add_words;
}

void aesctr_keystream(int engine, unsigned char *out, size_t nbytes, const unsigned char *key,
                      const unsigned char *counter) {
    (void)engine, (void)out, (void)nbytes, (void)key, (void)counter;
}

#endif
