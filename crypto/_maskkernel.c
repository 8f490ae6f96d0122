/* The masking kernel in C: target = source + sum_i sign_i * AES-128-CTR_i, one pass.
 *
 * Why native (issue #24): in the numpy path every mask is one OpenSSL call writing a
 * 128 KiB keystream tile and one numpy add reading it back; the add alone costs about a
 * quarter of the keystream's time, so that path tops out near 0.79 of the bare keystream
 * rate. Four engines produce the keystream here, all giving OpenSSL's AES-128-CTR bytes:
 *   vaes512, vaes, aesni
 *                an AES-128-CTR of our own (_aesctr.c): each AES state is added into the
 *                target's ring words straight from the register, two masks interleaved;
 *                the default wherever the CPU has AES-NI (VAES: 256-bit registers;
 *                vaes512: 512-bit, where the CPU has AVX-512 too);
 *   openssl      the kernel's first version: OpenSSL's EVP AES-128-CTR (the system
 *                libcrypto) writes two masks' keystream into small L1-resident buffers
 *                and both are added into an L1-resident block of the target while hot;
 *                for CPUs without AES-NI, and for a call whose counter would carry out of
 *                its low 32-bit word (the own engines count in 32 bits, OpenSSL in 128).
 * Every mask of a call is applied to one block (tile) before the next, so the target and
 * the source are each touched once. set_engine() forces one (tests, benchmarks). The
 * fixed-point encoding of spherecal.crypto.ring (range check, exact magic-number
 * rounding) is here too (encode()).
 *
 * The keystream is exactly what spherecal.crypto.prg defines (and what its numpy path
 * adds): the caller passes, per mask, the AES key and the 16-byte counter block of the
 * call's first byte; OpenSSL's CTR increments the whole 128-bit block, which equals the
 * v2 keystream's 32-bit counter within one segment, and the caller never lets a call
 * cross a segment boundary. Words are little-endian uint32 or uint64 and wrap (the ring);
 * the module refuses to load on a big-endian host (the numpy path then runs).
 *
 * Nothing here allocates Python objects while the GIL is released; key schedules are
 * cleansed before return (OpenSSL's when their contexts are freed, ours on the stack),
 * and so are the keystream buffers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <stdint.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "_aesctr.h"

/* Keystream produced per EVP call. Measured on the 2-core development machine (AMD EPYC,
 * 32 KiB L1d, 512 KiB L2 per core): 8 KiB (two keystream buffers, the zeros they encrypt
 * and the target block: 32 KiB) was among the best; 4 KiB and 16-64 KiB were no faster. */
#ifndef SPHERECAL_KS_BYTES
#define SPHERECAL_KS_BYTES 8192
#endif
#define KS_BYTES SPHERECAL_KS_BYTES
#define MAX_MASKS 4096

static EVP_CIPHER *ctr_cipher;
static const char *const engine_names[AESCTR_ENGINES] = {"openssl", "aesni", "vaes", "vaes512"};
/* The engine calls use: the fastest this CPU runs, unless set_engine() chose another.
 * Read and written with the GIL held only. */
static int engine = AESCTR_OPENSSL;
static const unsigned char zeros[KS_BYTES];

typedef uint64_t u64u __attribute__((aligned(1), may_alias));
typedef uint32_t u32u __attribute__((aligned(1), may_alias));

/* The plain loops (adds, range check, encoding) compiled three times, picked at load by
 * the CPU: AVX-512 (x86-64-v4), AVX2, baseline. The AVX-512 clone encodes 1,766,400
 * entries in 0.54 ms (64-bit words) and 0.31 ms (32-bit) against 0.70 and 0.41 with AVX2
 * (the AVX-512 development machine of 2026-11-26, best of 20); contraction stays off
 * (-ffp-contract=off), so the rounding is the same two IEEE operations. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

/* dst[i] = src[i] + sa * a[i] + sb * b[i] (src may be dst): two masks per pass over the
 * target block, so the block is loaded and stored once per pair of masks (measured in C
 * on the development machine, 11 masks, 8 KiB blocks: 0.85 of the bare keystream adding
 * one mask per pass, 0.89 two). */
#define PAIR(NAME, T, U)                                                                    \
    CLONES static void NAME(U *dst, const U *src, const T *restrict a, const T *restrict b, \
                            size_t n, int sa, int sb) {                                     \
        if (sa > 0 && sb > 0)                                                               \
            for (size_t i = 0; i < n; i++) dst[i] = src[i] + a[i] + b[i];                   \
        else if (sa > 0)                                                                    \
            for (size_t i = 0; i < n; i++) dst[i] = src[i] + a[i] - b[i];                   \
        else if (sb > 0)                                                                    \
            for (size_t i = 0; i < n; i++) dst[i] = src[i] - a[i] + b[i];                   \
        else                                                                                \
            for (size_t i = 0; i < n; i++) dst[i] = src[i] - a[i] - b[i];                   \
    }
PAIR(pair64, uint64_t, u64u)
PAIR(pair32, uint32_t, u32u)

/* dst[i] = src[i] + sign * ks[i] (src may be dst): the last mask of an odd count. */
#define SINGLE(NAME, T, U)                                                                   \
    CLONES static void NAME(U *dst, const U *src, const T *restrict ks, size_t n, int sign) { \
        if (sign > 0)                                                                        \
            for (size_t i = 0; i < n; i++) dst[i] = src[i] + ks[i];                          \
        else                                                                                 \
            for (size_t i = 0; i < n; i++) dst[i] = src[i] - ks[i];                          \
    }
SINGLE(add64, uint64_t, u64u)
SINGLE(add32, uint32_t, u32u)

static int keystream(EVP_CIPHER_CTX *ctx, unsigned char *ks, size_t len) {
    int outl = 0;
    return EVP_EncryptUpdate(ctx, ks, &outl, zeros, (int)len) == 1 && (size_t)outl == len;
}

/* The whole call with the GIL released; returns 0 or -1 (an OpenSSL failure). */
static int apply_masks(unsigned char *target, const unsigned char *source, size_t nbytes,
                       int word, EVP_CIPHER_CTX **ctx, const signed char *signs, size_t m) {
    unsigned char ks[2][KS_BYTES] __attribute__((aligned(64)));
    int rc = 0;
    for (size_t pos = 0; pos < nbytes && rc == 0; pos += KS_BYTES) {
        size_t len = nbytes - pos < KS_BYTES ? nbytes - pos : KS_BYTES;
        const unsigned char *src = source ? source + pos : target + pos;
        unsigned char *dst = target + pos;
        if (m == 0 && source) memcpy(dst, src, len);
        size_t i = 0;
        for (; i + 1 < m; i += 2, src = dst) {
            if (!keystream(ctx[i], ks[0], len) || !keystream(ctx[i + 1], ks[1], len)) {
                rc = -1;
                break;
            }
            if (word == 8)
                pair64((u64u *)dst, (const u64u *)src, (const uint64_t *)ks[0],
                       (const uint64_t *)ks[1], len / 8, signs[i], signs[i + 1]);
            else
                pair32((u32u *)dst, (const u32u *)src, (const uint32_t *)ks[0],
                       (const uint32_t *)ks[1], len / 4, signs[i], signs[i + 1]);
        }
        if (rc == 0 && i < m) {
            if (!keystream(ctx[i], ks[0], len)) {
                rc = -1;
                break;
            }
            if (word == 8)
                add64((u64u *)dst, (const u64u *)src, (const uint64_t *)ks[0], len / 8, signs[i]);
            else
                add32((u32u *)dst, (const u32u *)src, (const uint32_t *)ks[0], len / 4, signs[i]);
        }
    }
    OPENSSL_cleanse(ks, sizeof ks);
    return rc;
}

/* Parsed arguments shared by apply() and apply_new(). */
typedef struct {
    Py_buffer keys, counters, signs;
    EVP_CIPHER_CTX **ctx;
    size_t m, made;
} Plan;

static void plan_release(Plan *p) {
    if (p->ctx) {
        for (size_t i = 0; i < p->made; i++) EVP_CIPHER_CTX_free(p->ctx[i]);
        PyMem_Free(p->ctx);
        p->ctx = NULL;
    }
    PyBuffer_Release(&p->keys);
    PyBuffer_Release(&p->counters);
    PyBuffer_Release(&p->signs);
}

/* Check the plan; 0 or -1 with an exception set. */
static int plan_init(Plan *p, int word) {
    p->m = (size_t)p->signs.len;
    if (word != 4 && word != 8) {
        PyErr_SetString(PyExc_ValueError, "word_bytes must be 4 or 8");
        return -1;
    }
    if (p->m > MAX_MASKS || (size_t)p->keys.len != 16 * p->m ||
        (size_t)p->counters.len != 16 * p->m) {
        PyErr_SetString(PyExc_ValueError, "one 16-byte key and counter block per mask");
        return -1;
    }
    const signed char *sg = (const signed char *)p->signs.buf;
    for (size_t i = 0; i < p->m; i++)
        if (sg[i] != 1 && sg[i] != -1) {
            PyErr_SetString(PyExc_ValueError, "signs must be +1 or -1");
            return -1;
        }
    return 0;
}

/* One OpenSSL CTR context per mask (the EVP engine's plan); 0 or -1 with an exception. */
static int plan_contexts(Plan *p) {
    p->ctx = PyMem_Calloc(p->m ? p->m : 1, sizeof *p->ctx);
    if (!p->ctx) {
        PyErr_NoMemory();
        return -1;
    }
    for (; p->made < p->m; p->made++) {
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        if (!c) {
            PyErr_NoMemory();
            return -1;
        }
        p->ctx[p->made] = c;
        if (EVP_EncryptInit_ex2(c, ctr_cipher, (const unsigned char *)p->keys.buf + 16 * p->made,
                                (const unsigned char *)p->counters.buf + 16 * p->made,
                                NULL) != 1) {
            p->made++;
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-128-CTR initialisation failed");
            return -1;
        }
    }
    return 0;
}

/* The engine of this call: the chosen one, or OpenSSL's EVP path where a counter would
 * carry out of its low 32-bit word (never for the v2 keystream's segments). */
static int call_engine(const unsigned char *counters, size_t m, size_t nbytes) {
    if (engine != AESCTR_OPENSSL && aesctr_no_carry(counters, m, (nbytes + 15) / 16))
        return engine;
    return AESCTR_OPENSSL;
}

static int plan_run(Plan *p, unsigned char *target, const unsigned char *source, size_t nbytes,
                    int word) {
    int rc = 0, use = call_engine((const unsigned char *)p->counters.buf, p->m, nbytes);
    if (use == AESCTR_OPENSSL && p->m && plan_contexts(p) != 0) return -1;
    Py_BEGIN_ALLOW_THREADS
    if (use == AESCTR_OPENSSL)
        rc = apply_masks(target, source, nbytes, word, p->ctx, (const signed char *)p->signs.buf,
                         p->m);
    else if (p->m == 0)
        memmove(target, source ? source : target, nbytes);
    else
        aesctr_apply(use, target, source, nbytes, word, (const unsigned char *)p->keys.buf,
                     (const unsigned char *)p->counters.buf, (const signed char *)p->signs.buf,
                     p->m);
    Py_END_ALLOW_THREADS
    if (rc != 0) PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-128-CTR failed");
    return rc;
}

PyDoc_STRVAR(apply_doc,
"apply(target, source, keys, counters, signs, word_bytes)\n\n"
"target[:] = (source or target) + sum_i signs[i] * AES-128-CTR(keys[i], counters[i]),\n"
"in little-endian words of word_bytes (4 or 8) bytes, wrapping. keys and counters are\n"
"16 bytes per mask, signs one signed byte (+1 or -1) per mask; source is None or a\n"
"buffer of the target's length (it may be the target).");

static PyObject *apply(PyObject *self, PyObject *args) {
    (void)self;
    Plan p = {0};
    Py_buffer target = {0}, source = {0};
    PyObject *source_obj, *result = NULL;
    int word;
    if (!PyArg_ParseTuple(args, "w*Oy*y*y*i", &target, &source_obj, &p.keys, &p.counters,
                          &p.signs, &word))
        return NULL;
    int have_source = source_obj != Py_None;
    if (have_source && PyObject_GetBuffer(source_obj, &source, PyBUF_SIMPLE) != 0) goto done;
    if (plan_init(&p, word) != 0) goto done;
    if (target.len % word || (have_source && source.len != target.len)) {
        PyErr_SetString(PyExc_ValueError, "target must be whole words, source its length");
        goto done;
    }
    if (plan_run(&p, (unsigned char *)target.buf,
                 have_source ? (const unsigned char *)source.buf : NULL, (size_t)target.len,
                 word) == 0)
        result = Py_NewRef(Py_None);
done:
    plan_release(&p);
    PyBuffer_Release(&target);
    if (have_source) PyBuffer_Release(&source);
    return result;
}

PyDoc_STRVAR(apply_new_doc,
"apply_new(prefix, source, keys, counters, signs, word_bytes) -> bytes\n\n"
"prefix + (source + sum_i signs[i] * AES-128-CTR(keys[i], counters[i])) as one new bytes\n"
"object, the masked words written once, straight into it (a framed message without a\n"
"copy of its payload).");

static PyObject *apply_new(PyObject *self, PyObject *args) {
    (void)self;
    Plan p = {0};
    Py_buffer prefix = {0}, source = {0};
    PyObject *result = NULL;
    int word;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*i", &prefix, &source, &p.keys, &p.counters,
                          &p.signs, &word))
        return NULL;
    if (plan_init(&p, word) != 0) goto done;
    if (source.len % word) {
        PyErr_SetString(PyExc_ValueError, "source must be whole words");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, prefix.len + source.len);
    if (!result) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    memcpy(out, prefix.buf, (size_t)prefix.len);
    if (plan_run(&p, out + prefix.len, (const unsigned char *)source.buf, (size_t)source.len,
                 word) != 0)
        Py_CLEAR(result);
done:
    plan_release(&p);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&source);
    return result;
}

/* Fixed-point encoding (spherecal.crypto.ring.encode_into, the magic-number rounding):
 * rint(x * scale) in two's complement, low `word` bytes, for |x| * scale <= 2^50. */
#define MAGIC (1.5 * 4503599627370496.0) /* 1.5 * 2^52 */

/* Whether every entry lies in [-bound, bound] (bound positive and finite). On the bit
 * patterns: |x| <= bound exactly when the low 63 bits of x, as an integer, are at most
 * those of bound (IEEE order of non-negative doubles), and a NaN's exceed every finite
 * bound's; one subtraction per entry whose sign collects any excess, so the loop
 * vectorises (floating-point comparisons did not). The whole vector is read. */
CLONES static int in_bound(const u64u *x, size_t n, double bound) {
    int64_t limit, over = 0;
    memcpy(&limit, &bound, sizeof limit);
    for (size_t i = 0; i < n; i++) over |= limit - (int64_t)(x[i] & 0x7fffffffffffffffULL);
    return over >= 0;
}

CLONES static void encode64(u64u *out, const double *x, size_t n, double scale) {
    const int64_t magic_bits = 0x4338000000000000LL; /* the bit pattern of 1.5 * 2^52 */
    for (size_t i = 0; i < n; i++) {
        double y = x[i] * scale + MAGIC;
        int64_t bits;
        memcpy(&bits, &y, sizeof bits);
        out[i] = (uint64_t)(bits - magic_bits);
    }
}

CLONES static void encode32(u32u *out, const double *x, size_t n, double scale) {
    const int64_t magic_bits = 0x4338000000000000LL;
    for (size_t i = 0; i < n; i++) {
        double y = x[i] * scale + MAGIC;
        int64_t bits;
        memcpy(&bits, &y, sizeof bits);
        out[i] = (uint32_t)(uint64_t)(bits - magic_bits);
    }
}

PyDoc_STRVAR(encode_doc,
"encode(out, values, scale, bound, scratch=False) -> bool\n\n"
"If every float64 of values lies in [-bound, bound] (NaN does not), write\n"
"rint(values * scale) mod 2^w into out (uint32 or uint64 words, w from its size) and\n"
"return True; otherwise return False, having written nothing -- or, with scratch (out\n"
"holds nothing to keep), possibly part of out: then each L1-sized tile is checked and\n"
"encoded while it is in cache, one pass over values instead of two. The caller\n"
"guarantees bound * scale <= 2^50 and scale a power of two (the magic-number rounding\n"
"is exact).");

#define ENCODE_TILE 2048 /* entries: 16 KiB of float64 */

static PyObject *encode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer out = {0}, values = {0};
    double scale, bound;
    int scratch = 0;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "w*y*dd|p", &out, &values, &scale, &bound, &scratch)) return NULL;
    size_t n = (size_t)values.len / sizeof(double);
    if (values.len % sizeof(double) || (out.len != (Py_ssize_t)(4 * n) &&
                                        out.len != (Py_ssize_t)(8 * n))) {
        PyErr_SetString(PyExc_ValueError, "out must hold one 4- or 8-byte word per float64");
        goto done;
    }
    int ok = bound > 0 && bound <= DBL_MAX, wide = out.len == (Py_ssize_t)(8 * n);
    const double *x = (const double *)values.buf;
    Py_BEGIN_ALLOW_THREADS
    size_t step = scratch ? ENCODE_TILE : n;
    for (size_t at = 0; ok && at < n; at += step) {
        size_t k = n - at < step ? n - at : step;
        ok = in_bound((const u64u *)(x + at), k, bound);
        if (ok && wide)
            encode64((u64u *)out.buf + at, x + at, k, scale);
        else if (ok)
            encode32((u32u *)out.buf + at, x + at, k, scale);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(ok ? Py_True : Py_False);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&values);
    return result;
}

PyDoc_STRVAR(engines_doc,
"engines() -> tuple[str, ...]\n\n"
"The AES-128-CTR engines this CPU runs, widest first: 'vaes512' (512-bit VAES,\n"
"AVX-512), 'vaes' (256-bit VAES, AVX2), 'aesni' (128-bit AES-NI), 'openssl' (OpenSSL's\n"
"EVP path, always).");

static PyObject *engines(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    unsigned s = aesctr_supported();
    PyObject *out = PyTuple_New(0);
    for (int e = AESCTR_ENGINES - 1; out && e >= 0; e--)
        if (s & (1u << e)) {
            PyObject *name = PyUnicode_FromString(engine_names[e]);
            if (!name || _PyTuple_Resize(&out, PyTuple_GET_SIZE(out) + 1) != 0) {
                Py_XDECREF(name);
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(out, PyTuple_GET_SIZE(out) - 1, name);
        }
    return out;
}

PyDoc_STRVAR(get_engine_doc, "engine() -> str\n\nThe engine apply() and keystream() use now.");

static PyObject *get_engine(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(engine_names[engine]);
}

static int best_engine(void) {
    unsigned s = aesctr_supported();
    for (int e = AESCTR_ENGINES - 1; e > 0; e--)
        if (s & (1u << e)) return e;
    return AESCTR_OPENSSL;
}

PyDoc_STRVAR(set_engine_doc,
"set_engine(name) -> str\n\n"
"Use engine name ('vaes512', 'vaes', 'aesni', 'openssl', or 'auto': the widest) from\n"
"now on in this process and return the previous one; ValueError where this CPU lacks\n"
"it. For tests and benchmarks: every engine gives the same bytes.");

static PyObject *set_engine(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    int want = -1;
    if (strcmp(name, "auto") == 0) want = best_engine();
    for (int e = 0; e < AESCTR_ENGINES; e++)
        if (strcmp(name, engine_names[e]) == 0) want = e;
    if (want < 0 || !(aesctr_supported() & (1u << want))) {
        PyErr_Format(PyExc_ValueError, "AES-128-CTR engine %R is not available on this CPU",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    int previous = engine;
    engine = want;
    return PyUnicode_FromString(engine_names[previous]);
}

PyDoc_STRVAR(keystream_doc,
"keystream(out, key, counter) -> None\n\n"
"out[:] = the first len(out) bytes of AES-128-CTR(key, counter) (16 bytes each; the\n"
"counter block incremented as a 128-bit big-endian integer, as OpenSSL does), by the\n"
"current engine: the bare keystream, for known-answer tests and the benchmark's\n"
"yardstick.");

static PyObject *keystream_py(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer out = {0}, key = {0}, counter = {0};
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "w*y*y*", &out, &key, &counter)) return NULL;
    if (key.len != 16 || counter.len != 16) {
        PyErr_SetString(PyExc_ValueError, "one 16-byte key and counter block");
        goto done;
    }
    size_t n = (size_t)out.len;
    unsigned char *o = (unsigned char *)out.buf;
    int use = call_engine((const unsigned char *)counter.buf, 1, n), ok = 1;
    EVP_CIPHER_CTX *ctx = NULL;
    if (use == AESCTR_OPENSSL) {
        ctx = EVP_CIPHER_CTX_new();
        if (!ctx || EVP_EncryptInit_ex2(ctx, ctr_cipher, (const unsigned char *)key.buf,
                                        (const unsigned char *)counter.buf, NULL) != 1) {
            EVP_CIPHER_CTX_free(ctx);
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-128-CTR initialisation failed");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    if (use == AESCTR_OPENSSL)
        for (size_t pos = 0; ok && pos < n; pos += KS_BYTES)
            ok = keystream(ctx, o + pos, n - pos < KS_BYTES ? n - pos : KS_BYTES);
    else
        aesctr_keystream(use, o, n, (const unsigned char *)key.buf,
                         (const unsigned char *)counter.buf);
    Py_END_ALLOW_THREADS
    EVP_CIPHER_CTX_free(ctx);
    if (!ok)
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-128-CTR failed");
    else
        result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&counter);
    return result;
}

static PyMethodDef methods[] = {
    {"engines", engines, METH_NOARGS, engines_doc},
    {"engine", get_engine, METH_NOARGS, get_engine_doc},
    {"set_engine", set_engine, METH_VARARGS, set_engine_doc},
    {"keystream", keystream_py, METH_VARARGS, keystream_doc},
    {"apply", apply, METH_VARARGS, apply_doc},
    {"apply_new", apply_new, METH_VARARGS, apply_new_doc},
    {"encode", encode, METH_VARARGS, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_maskkernel",
    "Native masking kernel (AES-128-CTR added into ring words); see _maskkernel.c.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__maskkernel(void) {
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError, "the masking kernel assumes a little-endian host");
    return NULL;
#endif
    if (!ctr_cipher) ctr_cipher = EVP_CIPHER_fetch(NULL, "AES-128-CTR", NULL);
    if (!ctr_cipher) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no AES-128-CTR");
        return NULL;
    }
    engine = best_engine();
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "KS_BYTES", KS_BYTES) != 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
