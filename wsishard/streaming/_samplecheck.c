/* The common case of a sample's checks in a loader worker, in C: its image is a JPEG of the patch size, and its
 * ``.json`` is one JSON object, without building that object (the main process parses it when it is read).
 *
 * check(image, meta, height, width) -> int
 *
 *    0  ``image`` is a JPEG that ends with its EOI marker and whose first frame header (SOF) says width x height,
 *       read as wsishard.imageheader._jpeg_header walks its markers; and ``meta`` is certainly one JSON object
 *       (``json.loads(meta.decode("utf-8"))`` returns a dict) without a top-level key "label"
 *    1  the same, with a top-level key "label" (the worker parses it: the label may come from it)
 *   -1  anything else, or not certain: the worker's Python path then decides, with its own errors
 *
 * The JSON accepted is a strict subset of what Python's json module reads: ASCII only, RFC 8259 grammar, at most
 * MAX_DEPTH nested containers, numbers of at most MAX_NUMBER characters (Python refuses integers of more than
 * 4,300 digits), no NaN or Infinity, and no backslash in a top-level key (so an escaped "label" is never missed).
 * Everything outside it is -1, never 0 or 1: what this says is valid, json.loads reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_DEPTH 64
#define MAX_NUMBER 64

typedef struct {
    const unsigned char *s;
    Py_ssize_t n, i;
} Text;

static void skip_ws(Text *t) {
    while (t->i < t->n && (t->s[t->i] == ' ' || t->s[t->i] == '\t' || t->s[t->i] == '\n' || t->s[t->i] == '\r'))
        t->i++;
}

static int is_hex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A string from its opening quote: 0 and t->i past its closing quote, -1 if not a string json reads strictly.
 * *escaped is set when it holds a backslash escape. */
static int string(Text *t, int *escaped) {
    t->i++; /* the opening quote */
    *escaped = 0;
    while (t->i < t->n) {
        unsigned char c = t->s[t->i];
        if (c == '"') {
            t->i++;
            return 0;
        }
        if (c < 0x20 || c >= 0x80) return -1; /* control characters: json's strict mode refuses them */
        if (c == '\\') {
            *escaped = 1;
            if (t->i + 1 >= t->n) return -1;
            unsigned char e = t->s[t->i + 1];
            if (e == 'u') {
                if (t->i + 6 > t->n) return -1;
                for (int k = 2; k < 6; k++)
                    if (!is_hex(t->s[t->i + k])) return -1;
                t->i += 6;
                continue;
            }
            if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't') return -1;
            t->i += 2;
            continue;
        }
        t->i++;
    }
    return -1; /* not closed */
}

static int digits(Text *t) {
    Py_ssize_t a = t->i;
    while (t->i < t->n && t->s[t->i] >= '0' && t->s[t->i] <= '9') t->i++;
    return t->i > a ? 0 : -1;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, as json's number pattern */
static int number(Text *t) {
    Py_ssize_t a = t->i;
    if (t->s[t->i] == '-') t->i++;
    if (t->i >= t->n) return -1;
    if (t->s[t->i] == '0') {
        t->i++;
    } else if (digits(t) < 0) {
        return -1;
    }
    if (t->i < t->n && t->s[t->i] == '.') {
        t->i++;
        if (digits(t) < 0) return -1;
    }
    if (t->i < t->n && (t->s[t->i] == 'e' || t->s[t->i] == 'E')) {
        t->i++;
        if (t->i < t->n && (t->s[t->i] == '+' || t->s[t->i] == '-')) t->i++;
        if (digits(t) < 0) return -1;
    }
    return t->i - a <= MAX_NUMBER ? 0 : -1;
}

static int literal(Text *t, const char *word, Py_ssize_t len) {
    if (t->n - t->i < len || memcmp(t->s + t->i, word, (size_t)len) != 0) return -1;
    t->i += len;
    return 0;
}

static int value(Text *t, int depth);

/* An object or an array from its opening bracket. For the top-level object (*label not NULL), *label is set
 * when a key is exactly "label"; a top-level key holding an escape is -1. */
static int container(Text *t, int depth, int *label) {
    unsigned char close = t->s[t->i] == '{' ? '}' : ']';
    if (depth >= MAX_DEPTH) return -1;
    t->i++;
    skip_ws(t);
    if (t->i < t->n && t->s[t->i] == close) {
        t->i++;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            int escaped;
            if (t->i >= t->n || t->s[t->i] != '"') return -1;
            Py_ssize_t key = t->i + 1;
            if (string(t, &escaped) < 0) return -1;
            if (label != NULL) {
                if (escaped) return -1;
                if (t->i - 1 - key == 5 && memcmp(t->s + key, "label", 5) == 0) *label = 1;
            }
            skip_ws(t);
            if (t->i >= t->n || t->s[t->i] != ':') return -1;
            t->i++;
            skip_ws(t);
        }
        if (value(t, depth + 1) < 0) return -1;
        skip_ws(t);
        if (t->i >= t->n) return -1;
        if (t->s[t->i] == close) {
            t->i++;
            return 0;
        }
        if (t->s[t->i] != ',') return -1;
        t->i++;
        skip_ws(t);
    }
}

static int value(Text *t, int depth) {
    int escaped;
    if (t->i >= t->n) return -1;
    switch (t->s[t->i]) {
    case '{':
    case '[':
        return container(t, depth, NULL);
    case '"':
        return string(t, &escaped);
    case 't':
        return literal(t, "true", 4);
    case 'f':
        return literal(t, "false", 5);
    case 'n':
        return literal(t, "null", 4);
    default:
        if (t->s[t->i] == '-' || (t->s[t->i] >= '0' && t->s[t->i] <= '9')) return number(t);
        return -1;
    }
}

/* 0: one JSON object, no "label" key; 1: with one; -1: anything else, or not certain */
static int json_object(const unsigned char *s, Py_ssize_t n) {
    Text t = {s, n, 0};
    int label = 0;
    skip_ws(&t);
    if (t.i >= t.n || t.s[t.i] != '{') return -1;
    if (container(&t, 0, &label) < 0) return -1;
    skip_ws(&t);
    return t.i == t.n ? label : -1;
}

/* 1 if a JPEG ending with EOI whose first SOF says width x height (as _jpeg_header reads it), else 0 */
static int jpeg_of_size(const unsigned char *d, Py_ssize_t n, long height, long width) {
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8 || d[n - 2] != 0xFF || d[n - 1] != 0xD9) return 0;
    Py_ssize_t pos = 2;
    while (pos + 4 <= n) {
        unsigned char fill = d[pos], marker = d[pos + 1];
        long length = ((long)d[pos + 2] << 8) | d[pos + 3];
        if (fill != 0xFF) return 0;
        int frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
        int bare = (marker >= 0xD0 && marker <= 0xD8) || marker == 0x01; /* no length */
        if (frame) {
            if (pos + 9 > n) return 0;
            long h = ((long)d[pos + 5] << 8) | d[pos + 6], w = ((long)d[pos + 7] << 8) | d[pos + 8];
            return h == height && w == width;
        } else if (marker == 0xFF) {
            pos += 1;
        } else if (bare) {
            pos += 2;
        } else if (marker == 0xD9 || marker == 0xDA) {
            return 0; /* the image ends, or its scan starts, before any frame header */
        } else {
            pos += 2 + length;
        }
    }
    return 0;
}

static PyObject *check(PyObject *self, PyObject *args) {
    Py_buffer image, meta;
    long height, width;
    if (!PyArg_ParseTuple(args, "y*y*ll", &image, &meta, &height, &width)) return NULL;
    int code = -1;
    if (jpeg_of_size(image.buf, image.len, height, width)) code = json_object(meta.buf, meta.len);
    PyBuffer_Release(&image);
    PyBuffer_Release(&meta);
    return PyLong_FromLong(code);
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, "check(image, meta, height, width) -> 0, 1 or -1"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_samplecheck", "A loader sample's common-case checks, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__samplecheck(void) { return PyModule_Create(&module); }
