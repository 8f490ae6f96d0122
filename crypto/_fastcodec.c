/* The canonical encoding's hot paths in C (spherecal.crypto._codec and the graph's order).
 *
 * Why native (issue #24): a site of a SecAgg+ job does O(k) work per neighbour, but it
 * still reads the whole roster several times per job (the spec's participants, the
 * key roster's U1, the share bundle's U2, the survivor and dropout sets), checks each
 * list, orders the whole roster on the Harary cycle and encodes the survivor set it
 * signs; per neighbour it builds a dozen KDF, commitment and associated-data contexts;
 * and the coordinator writes those lists into a message for every participant.
 * In Python a list costs ~0.23 us per id to decode and ~0.4 us per id to hash, and a
 * context ~2-3 us: at n = 500 about 1.5 ms of a site's ~6 ms of protocol work. Every
 * function here gives exactly what the Python code that defines it gives
 * (_codec.Reader.texts and Writer.texts, _fields.sorted_unique and spec._check_ids,
 * _codec.encode_context, graph._order_keys); that code stays the definition and the
 * fallback, and the tests compare the two on valid and malformed input. Where a
 * function meets anything it does not handle (a defect, an unusual type) it returns
 * None and the Python code runs, raising its precise error.
 *
 *   read_texts(buffer, pos, count, max_len) -> (tuple[str, ...], end) | None
 *       count u32-big-endian-length-prefixed UTF-8 strings from buffer[pos:]; None on
 *       any defect (truncated, a length over max_len, invalid UTF-8). Nothing is
 *       allocated for a count the buffer cannot hold.
 *   write_texts(ids) -> bytes | None
 *       u32(count) then u32(len) utf8 per id: the list encoding read_texts reads (the
 *       coordinator writes U1, U2 and the survivor and dropout sets into a message for
 *       every participant: O(n^2) ids per job); None for anything but a sequence of
 *       encodable str.
 *   sorted_ids(items, max_len, printable) -> bool
 *       True if items is a tuple of str, each 1..max_len bytes of UTF-8 (and printable
 *       if asked), strictly increasing; False otherwise (the caller then finds why).
 *   encode_context(parts) -> bytes | None
 *       the context encoding of a tuple of parts: u32(count), then per part u8(0) u64
 *       (an int), u8(1) u32 len utf8 (an exact str) or u8(2) u32 len bytes (exact
 *       bytes); None for any other part or an int outside 0..2^64-1.
 *   context_texts(ids) -> bytes
 *       u8(1) u32(len) utf8(id) per id, concatenated: str parts of a context, for the
 *       survivor set a consistency signature covers.
 *   order_digests(prefix, ids) -> list[bytes]
 *       SHA-256(prefix || u8(1) u32(len) utf8(id)) per id (the context encoding of a
 *       last str part), through OpenSSL with prefix hashed once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include <openssl/evp.h>

static EVP_MD *sha256;

PyDoc_STRVAR(read_texts_doc,
"read_texts(buffer, pos, count, max_len) -> (tuple[str, ...], end) or None\n\n"
"count length-prefixed UTF-8 strings from buffer at pos, and the position after them;\n"
"None if any is truncated, longer than max_len bytes or not UTF-8.");

static PyObject *read_texts(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view = {0};
    Py_ssize_t pos, count, max_len;
    PyObject *out = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &pos, &count, &max_len)) return NULL;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len;
    /* every string takes at least its 4-byte length: refuse before allocating */
    if (pos < 0 || count < 0 || max_len < 0 || pos > end || count > (end - pos) / 4) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    out = PyTuple_New(count);
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - pos < 4) goto defect;
        uint32_t length = ((uint32_t)data[pos] << 24) | ((uint32_t)data[pos + 1] << 16) |
                          ((uint32_t)data[pos + 2] << 8) | (uint32_t)data[pos + 3];
        pos += 4;
        if ((Py_ssize_t)length > max_len || (Py_ssize_t)length > end - pos) goto defect;
        PyObject *text = PyUnicode_DecodeUTF8((const char *)data + pos, length, "strict");
        if (!text) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto done;
            PyErr_Clear();
            goto defect;
        }
        PyTuple_SET_ITEM(out, i, text);
        pos += length;
    }
    result = Py_BuildValue("(On)", out, pos);
    goto done;
defect:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(write_texts_doc,
"write_texts(ids) -> bytes or None\n\n"
"u32be(count), then u32be(len(utf8)) + utf8 per id; None unless every id is an\n"
"encodable str of at most 2**32-1 bytes.");

static PyObject *write_texts(PyObject *self, PyObject *ids) {
    (void)self;
    PyObject *seq = PySequence_Fast(ids, "ids must be a sequence"), *out = NULL;
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 4;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if ((uint64_t)n > UINT32_MAX) goto none;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length;
        if (!PyUnicode_Check(items[i])) goto none;
        if (!PyUnicode_AsUTF8AndSize(items[i], &length)) {
            PyErr_Clear(); /* a surrogate: the Python path raises its error */
            goto none;
        }
        if ((uint64_t)length > UINT32_MAX || length > PY_SSIZE_T_MAX - 4 - total) goto none;
        total += 4 + length;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    w[0] = (unsigned char)(n >> 24);
    w[1] = (unsigned char)(n >> 16);
    w[2] = (unsigned char)(n >> 8);
    w[3] = (unsigned char)n;
    w += 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length;
        const char *utf8 = PyUnicode_AsUTF8AndSize(items[i], &length); /* cached above */
        w[0] = (unsigned char)(length >> 24);
        w[1] = (unsigned char)(length >> 16);
        w[2] = (unsigned char)(length >> 8);
        w[3] = (unsigned char)length;
        memcpy(w + 4, utf8, (size_t)length);
        w += 4 + length;
    }
    goto done;
none:
    out = Py_NewRef(Py_None);
done:
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(order_digests_doc,
"order_digests(prefix, ids) -> list[bytes]\n\n"
"SHA-256(prefix + u8(1) + u32be(len(utf8)) + utf8) of every id in the sequence ids.");

static PyObject *order_digests(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prefix = {0};
    PyObject *ids, *seq = NULL, *out = NULL;
    EVP_MD_CTX *head = NULL, *each = NULL;
    if (!PyArg_ParseTuple(args, "y*O", &prefix, &ids)) return NULL;
    seq = PySequence_Fast(ids, "ids must be a sequence of str");
    if (!seq) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    head = EVP_MD_CTX_new();
    each = EVP_MD_CTX_new();
    if (!head || !each || EVP_DigestInit_ex2(head, sha256, NULL) != 1 ||
        EVP_DigestUpdate(head, prefix.buf, (size_t)prefix.len) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-256 initialisation failed");
        goto fail;
    }
    out = PyList_New(n);
    if (!out) goto fail;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "ids must be str");
            goto fail;
        }
        Py_ssize_t length;
        const char *utf8 = PyUnicode_AsUTF8AndSize(items[i], &length);
        if (!utf8) goto fail;
        if ((uint64_t)length > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "id too long");
            goto fail;
        }
        unsigned char tag[5] = {1, (unsigned char)(length >> 24), (unsigned char)(length >> 16),
                                (unsigned char)(length >> 8), (unsigned char)length};
        unsigned char digest[32];
        unsigned int size = 0;
        if (EVP_MD_CTX_copy_ex(each, head) != 1 || EVP_DigestUpdate(each, tag, 5) != 1 ||
            EVP_DigestUpdate(each, utf8, (size_t)length) != 1 ||
            EVP_DigestFinal_ex(each, digest, &size) != 1 || size != 32) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-256 failed");
            goto fail;
        }
        PyObject *value = PyBytes_FromStringAndSize((const char *)digest, 32);
        if (!value) goto fail;
        PyList_SET_ITEM(out, i, value);
    }
    EVP_MD_CTX_free(head);
    EVP_MD_CTX_free(each);
    Py_DECREF(seq);
    PyBuffer_Release(&prefix);
    return out;
fail:
    EVP_MD_CTX_free(head);
    EVP_MD_CTX_free(each);
    Py_XDECREF(seq);
    Py_XDECREF(out);
    PyBuffer_Release(&prefix);
    return NULL;
}

PyDoc_STRVAR(context_texts_doc,
"context_texts(ids) -> bytes\n\n"
"u8(1) + u32be(len(utf8)) + utf8 for every id in the sequence ids, concatenated.");

static PyObject *context_texts(PyObject *self, PyObject *ids) {
    (void)self;
    PyObject *seq = PySequence_Fast(ids, "ids must be a sequence of str"), *out = NULL;
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length;
        if (!PyUnicode_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "ids must be str");
            goto done;
        }
        if (!PyUnicode_AsUTF8AndSize(items[i], &length)) goto done;
        if ((uint64_t)length > UINT32_MAX || total > PY_SSIZE_T_MAX - 5 - length) {
            PyErr_SetString(PyExc_ValueError, "ids too long");
            goto done;
        }
        total += 5 + length;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length;
        const char *utf8 = PyUnicode_AsUTF8AndSize(items[i], &length); /* cached above */
        w[0] = 1;
        w[1] = (unsigned char)(length >> 24);
        w[2] = (unsigned char)(length >> 16);
        w[3] = (unsigned char)(length >> 8);
        w[4] = (unsigned char)length;
        memcpy(w + 5, utf8, (size_t)length);
        w += 5 + length;
    }
done:
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(sorted_ids_doc,
"sorted_ids(items, max_len, printable) -> bool\n\n"
"Whether items is a tuple of str, each of 1..max_len UTF-8 bytes (printable if asked),\n"
"in strictly increasing order.");

static PyObject *sorted_ids(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items;
    Py_ssize_t max_len;
    int printable;
    if (!PyArg_ParseTuple(args, "Onp", &items, &max_len, &printable)) return NULL;
    if (!PyTuple_Check(items)) Py_RETURN_FALSE;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *previous = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyUnicode_CheckExact(item)) Py_RETURN_FALSE;
        Py_ssize_t length;
        if (PyUnicode_IS_ASCII(item)) {
            length = PyUnicode_GET_LENGTH(item);
        } else if (!PyUnicode_AsUTF8AndSize(item, &length)) {
            PyErr_Clear(); /* a surrogate: the Python check says so */
            Py_RETURN_FALSE;
        }
        if (length < 1 || length > max_len) Py_RETURN_FALSE;
        if (printable) {
            int kind = PyUnicode_KIND(item);
            const void *data = PyUnicode_DATA(item);
            Py_ssize_t chars = PyUnicode_GET_LENGTH(item);
            for (Py_ssize_t c = 0; c < chars; c++)
                if (!Py_UNICODE_ISPRINTABLE(PyUnicode_READ(kind, data, c))) Py_RETURN_FALSE;
        }
        if (previous) {
            int lower = PyUnicode_Compare(previous, item);
            if (lower == -1 && PyErr_Occurred()) return NULL;
            if (lower >= 0) Py_RETURN_FALSE;
        }
        previous = item;
    }
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(encode_context_doc,
"encode_context(parts) -> bytes or None\n\n"
"The context encoding of the tuple parts (ints, exact str, exact bytes); None for any\n"
"other part or an int outside 0..2**64-1.");

#define MAX_FIELD_BYTES ((Py_ssize_t)1 << 31)

static void put_u32(unsigned char *w, uint64_t v) {
    w[0] = (unsigned char)(v >> 24);
    w[1] = (unsigned char)(v >> 16);
    w[2] = (unsigned char)(v >> 8);
    w[3] = (unsigned char)v;
}

static PyObject *encode_context(PyObject *self, PyObject *parts) {
    (void)self;
    if (!PyTuple_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "parts must be a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(parts), total = 4;
    if ((uint64_t)n > UINT32_MAX) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = PyTuple_GET_ITEM(parts, i);
        Py_ssize_t length;
        if (PyUnicode_CheckExact(part)) {
            if (!PyUnicode_AsUTF8AndSize(part, &length)) {
                PyErr_Clear();
                Py_RETURN_NONE;
            }
            if ((uint64_t)length > UINT32_MAX) Py_RETURN_NONE;
        } else if (PyBytes_CheckExact(part)) {
            length = PyBytes_GET_SIZE(part);
            if (length > MAX_FIELD_BYTES) Py_RETURN_NONE;
        } else if (PyLong_Check(part) && !PyBool_Check(part)) {
            (void)PyLong_AsUnsignedLongLong(part);
            if (PyErr_Occurred()) {
                PyErr_Clear();
                Py_RETURN_NONE;
            }
            length = 4; /* u8 tag + u64 = 9 bytes, counted as 5 + 4 */
        } else {
            Py_RETURN_NONE;
        }
        /* the size cannot overflow for parts that fit in memory; let Python refuse it */
        if (length > PY_SSIZE_T_MAX - 5 - total) Py_RETURN_NONE;
        total += 5 + length;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    put_u32(w, (uint64_t)n);
    w += 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = PyTuple_GET_ITEM(parts, i);
        Py_ssize_t length;
        const char *data;
        if (PyUnicode_CheckExact(part)) {
            data = PyUnicode_AsUTF8AndSize(part, &length); /* cached by the first pass */
            *w++ = 1;
        } else if (PyBytes_CheckExact(part)) {
            data = PyBytes_AS_STRING(part);
            length = PyBytes_GET_SIZE(part);
            *w++ = 2;
        } else {
            unsigned long long v = PyLong_AsUnsignedLongLong(part);
            *w++ = 0;
            put_u32(w, (uint64_t)v >> 32);
            put_u32(w + 4, (uint64_t)v & 0xffffffffu);
            w += 8;
            continue;
        }
        put_u32(w, (uint64_t)length);
        memcpy(w + 4, data, (size_t)length);
        w += 4 + length;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"sorted_ids", sorted_ids, METH_VARARGS, sorted_ids_doc},
    {"encode_context", encode_context, METH_O, encode_context_doc},
    {"context_texts", context_texts, METH_O, context_texts_doc},
    {"read_texts", read_texts, METH_VARARGS, read_texts_doc},
    {"write_texts", write_texts, METH_O, write_texts_doc},
    {"order_digests", order_digests, METH_VARARGS, order_digests_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastcodec",
    "The canonical encoding's hot paths (id lists, contexts, order digests); see _fastcodec.c.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcodec(void) {
    if (!sha256) sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!sha256) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256");
        return NULL;
    }
    return PyModule_Create(&module);
}
