/* One engine of _aesctr.c, instantiated three times (VAES on zmm and on ymm, AES-NI on
 * xmm): _aesctr.c defines SFX, TGT, VEC, BPV (16-byte blocks per vector), NS (vectors per
 * mask in a pair group) and the vector operations, then includes this file, which
 * undefines them at its end. Not a header of its own:
 * every function here is static, compiled for TGT only, and reached through the runtime
 * dispatch of _aesctr.c.
 *
 * The AES state of a block is XOR-ed with round key 0 as it is built (the nonce is
 * folded into the key once per call, the counter word OR-ed in), runs 9 aesenc and one
 * aesenclast, and is then *added* (or subtracted) into the target as ring words: no
 * keystream buffer, each target vector loaded and stored once per pair of masks. */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)
#define VB (BPV * 16)   /* bytes per vector */
#define GB (NS * VB)    /* bytes per pair group: NS vectors of each of two masks */
#define ALWAYS static inline __attribute__((always_inline)) TGT

typedef struct {
    VEC rk[11]; /* rk[0] unused here: folded into nrk0 */
    VEC nrk0;   /* (nonce || 0^32) XOR round key 0, in every 128-bit lane */
    VEC ctr;    /* 32-bit word 3 of lane j: the counter of the call's block j, native order */
} FN(mask_t);

TGT static void FN(prepare)(FN(mask_t) *mk, const unsigned char *key,
                            const unsigned char *counter) {
    __m128i rk[11];
    aesctr_expand_key(key, rk);
    for (int r = 1; r < 11; r++) mk->rk[r] = VFROM128(rk[r]);
    __m128i nonce = _mm_and_si128(_mm_loadu_si128((const __m128i *)counter),
                                  _mm_setr_epi32(-1, -1, -1, 0));
    mk->rk[0] = VFROM128(_mm_setzero_si128());
    mk->nrk0 = VFROM128(_mm_xor_si128(nonce, rk[0]));
    uint32_t lo = ((uint32_t)counter[12] << 24) | ((uint32_t)counter[13] << 16) |
                  ((uint32_t)counter[14] << 8) | (uint32_t)counter[15];
    mk->ctr = VCTR0(lo);
    OPENSSL_cleanse(rk, sizeof rk);
}

/* States of n vectors of `mk` from call block `blk`: round 0 done. */
ALWAYS void FN(start)(VEC *s, int n, const FN(mask_t) *mk, uint32_t blk) {
    const VEC bswap = VBSWAP;
    VEC c = VADD32(mk->ctr, VSET1_32((int)blk));
    for (int k = 0; k < n; k++)
        s[k] = VXOR(mk->nrk0, VSHUF(VADD32(c, VSET1_32(k * BPV)), bswap));
}

ALWAYS void FN(rounds)(VEC *s, int n, const FN(mask_t) *mk) {
    for (int r = 1; r < 10; r++)
        for (int k = 0; k < n; k++) s[k] = VENC(s[k], mk->rk[r]);
    for (int k = 0; k < n; k++) s[k] = VENCLAST(s[k], mk->rk[10]);
}

/* v + sign * ks in the ring (sign 0: ks itself). */
ALWAYS VEC FN(combine)(VEC v, VEC ks, int sign, int wide) {
    if (sign == 0) return ks;
    if (wide) return sign > 0 ? VADD64(v, ks) : VSUB64(v, ks);
    return sign > 0 ? VADD32(v, ks) : VSUB32(v, ks);
}

/* GB bytes: dst = src + sa * PRG_A + sb * PRG_B, the two masks' rounds interleaved. */
ALWAYS void FN(pair_group)(unsigned char *dst, const unsigned char *src, const FN(mask_t) *A,
                           const FN(mask_t) *B, uint32_t blk, int sa, int sb, int wide) {
    VEC a[NS], b[NS];
    FN(start)(a, NS, A, blk);
    FN(start)(b, NS, B, blk);
    for (int r = 1; r < 10; r++)
        for (int k = 0; k < NS; k++) {
            a[k] = VENC(a[k], A->rk[r]);
            b[k] = VENC(b[k], B->rk[r]);
        }
    for (int k = 0; k < NS; k++) {
        a[k] = VENCLAST(a[k], A->rk[10]);
        b[k] = VENCLAST(b[k], B->rk[10]);
    }
    for (int k = 0; k < NS; k++) {
        VEC v = VLOAD(src + k * VB);
        v = FN(combine)(FN(combine)(v, a[k], sa, wide), b[k], sb, wide);
        VSTORE(dst + k * VB, v);
    }
}

/* n * VB bytes of one mask (n = NS or 2 NS: enough blocks in flight to fill the AES units). */
ALWAYS void FN(single_group)(unsigned char *dst, const unsigned char *src, const FN(mask_t) *A,
                             uint32_t blk, int n, int sign, int wide) {
    VEC a[2 * NS];
    FN(start)(a, n, A, blk);
    FN(rounds)(a, n, A);
    for (int k = 0; k < n; k++)
        VSTORE(dst + k * VB, FN(combine)(sign ? VLOAD(src + k * VB) : a[k], a[k], sign, wide));
}

ALWAYS void FN(pair_loop)(unsigned char *dst, const unsigned char *src, size_t groups,
                          const FN(mask_t) *A, const FN(mask_t) *B, uint32_t blk, int sa, int sb,
                          int wide) {
    for (size_t g = 0; g < groups; g++)
        FN(pair_group)(dst + g * GB, src + g * GB, A, B, blk + (uint32_t)(g * GB / 16), sa, sb,
                       wide);
}

/* The loop specialised per sign pair and ring (constants let the compiler drop branches). */
TGT static void FN(pair_run)(unsigned char *dst, const unsigned char *src, size_t groups,
                             const FN(mask_t) *A, const FN(mask_t) *B, uint32_t blk, int sa,
                             int sb, int wide) {
#define PR(SA, SB, W) FN(pair_loop)(dst, src, groups, A, B, blk, SA, SB, W)
    if (wide) {
        if (sa > 0) { if (sb > 0) PR(1, 1, 1); else PR(1, -1, 1); }
        else { if (sb > 0) PR(-1, 1, 1); else PR(-1, -1, 1); }
    } else {
        if (sa > 0) { if (sb > 0) PR(1, 1, 0); else PR(1, -1, 0); }
        else { if (sb > 0) PR(-1, 1, 0); else PR(-1, -1, 0); }
    }
#undef PR
}

ALWAYS void FN(single_loop)(unsigned char *dst, const unsigned char *src, size_t nbytes,
                            const FN(mask_t) *A, uint32_t blk, int sign, int wide) {
    size_t pos = 0;
    for (; pos + 2 * GB <= nbytes; pos += 2 * GB)
        FN(single_group)(dst + pos, src + pos, A, blk + (uint32_t)(pos / 16), 2 * NS, sign,
                         wide);
    if (pos + GB <= nbytes)
        FN(single_group)(dst + pos, src + pos, A, blk + (uint32_t)(pos / 16), NS, sign, wide);
}

/* nbytes (a multiple of GB) of one mask; sign 0 stores the keystream (src unused). */
TGT static void FN(single_run)(unsigned char *dst, const unsigned char *src, size_t nbytes,
                               const FN(mask_t) *A, uint32_t blk, int sign, int wide) {
    if (sign == 0) FN(single_loop)(dst, dst, nbytes, A, blk, 0, 1);
    else if (wide) {
        if (sign > 0) FN(single_loop)(dst, src, nbytes, A, blk, 1, 1);
        else FN(single_loop)(dst, src, nbytes, A, blk, -1, 1);
    } else {
        if (sign > 0) FN(single_loop)(dst, src, nbytes, A, blk, 1, 0);
        else FN(single_loop)(dst, src, nbytes, A, blk, -1, 0);
    }
}

/* The last n < GB bytes of a call, one mask: the keystream of the group into a stack
 * buffer (wiped), then word by word; never a byte past dst + n or src + n. */
TGT static void FN(tail)(unsigned char *dst, const unsigned char *src, size_t n,
                         const FN(mask_t) *A, uint32_t blk, int sign, int word) {
    VEC a[NS];
    FN(start)(a, NS, A, blk);
    FN(rounds)(a, NS, A);
    unsigned char ks[GB];
    for (int k = 0; k < NS; k++) VSTORE(ks + k * VB, a[k]);
    aesctr_add_words(dst, src, ks, n, sign, word);
    OPENSSL_cleanse(ks, sizeof ks);
}

#define MASK_GROUP 16 /* masks prepared at once: 16 key schedules on the stack */
#define TILE_BYTES 8192 /* target bytes kept in L1 while every mask of a group is added */

TGT static void FN(apply)(unsigned char *target, const unsigned char *source, size_t nbytes,
                          int word, const unsigned char *keys, const unsigned char *counters,
                          const signed char *signs, size_t m) {
    FN(mask_t) mk[MASK_GROUP];
    int wide = word == 8;
    for (size_t g0 = 0; g0 < m; g0 += MASK_GROUP) {
        size_t gm = m - g0 < MASK_GROUP ? m - g0 : MASK_GROUP;
        for (size_t i = 0; i < gm; i++)
            FN(prepare)(&mk[i], keys + 16 * (g0 + i), counters + 16 * (g0 + i));
        const signed char *sg = signs + g0;
        for (size_t pos = 0; pos < nbytes; pos += TILE_BYTES) {
            size_t len = nbytes - pos < TILE_BYTES ? nbytes - pos : TILE_BYTES;
            size_t full = len - len % GB;
            const unsigned char *src = g0 == 0 && source ? source + pos : target + pos;
            unsigned char *dst = target + pos;
            uint32_t blk = (uint32_t)(pos / 16), tblk = (uint32_t)((pos + full) / 16);
            size_t i = 0;
            for (; i + 1 < gm; i += 2, src = dst) {
                FN(pair_run)(dst, src, full / GB, &mk[i], &mk[i + 1], blk, sg[i], sg[i + 1], wide);
                if (len > full) {
                    FN(tail)(dst + full, src + full, len - full, &mk[i], tblk, sg[i], word);
                    FN(tail)(dst + full, dst + full, len - full, &mk[i + 1], tblk, sg[i + 1], word);
                }
            }
            if (i < gm) {
                FN(single_run)(dst, src, full, &mk[i], blk, sg[i], wide);
                if (len > full) FN(tail)(dst + full, src + full, len - full, &mk[i], tblk, sg[i], word);
            }
        }
    }
    OPENSSL_cleanse(mk, sizeof mk);
    VCLEAR();
}

TGT static void FN(keystream)(unsigned char *out, size_t nbytes, const unsigned char *key,
                              const unsigned char *counter) {
    FN(mask_t) mk;
    FN(prepare)(&mk, key, counter);
    size_t full = nbytes - nbytes % GB;
    FN(single_run)(out, out, full, &mk, 0, 0, 1);
    if (nbytes > full) FN(tail)(out + full, out + full, nbytes - full, &mk, (uint32_t)(full / 16), 0, 1);
    OPENSSL_cleanse(&mk, sizeof mk);
    VCLEAR();
}

/* The engine's parameters, so that the next instantiation defines its own. */
#undef SFX
#undef TGT
#undef VEC
#undef BPV
#undef NS
#undef VLOAD
#undef VSTORE
#undef VXOR
#undef VADD64
#undef VSUB64
#undef VADD32
#undef VSUB32
#undef VENC
#undef VENCLAST
#undef VSHUF
#undef VSET1_32
#undef VFROM128
#undef VCTR0
#undef VBSWAP
#undef VCLEAR
#undef FN
#undef CAT
#undef CAT_
#undef VB
#undef GB
#undef ALWAYS
#undef MASK_GROUP
#undef TILE_BYTES
