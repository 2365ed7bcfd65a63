/* The common case of wsishard.shards.reader.TarSamples in C: plain tar members grouped into samples.
 *
 * scan(buf, pos, end, exts, phase, step, state) -> (pos, samples)
 *
 * Reads the tar headers lying whole in buf[pos:end], each with its member's data and padding, and groups the
 * regular files named <key>.<ext> (ext in the frozenset exts) into samples exactly as the Python reader does:
 * runs of members sharing a key, numbered from 0 in tar order, the sample k kept when k % step == phase.
 * ``state`` is the Python reader's list [key, group, keeps, seen], read and written back: the open sample
 * carries over from call to call (and to and from the Python reader between calls). ``samples`` is the list of
 * (key, {ext: bytes}) completed in this call; ``pos`` where the call stopped.
 *
 * It stops, touching nothing of the header there, at the first header it does not take: one not lying whole in
 * the buffer with its data and padding, a zero block, an extension header that names or sizes the next member (a
 * GNU long name, a pax ``path`` or ``size``, or a pax record that does not parse), a checksum that fails, a number
 * that is not plain octal, a kept member larger than the reader's limit, or a sample holding an extension twice.
 * Extension headers that change nothing are read past (pax records other than ``path`` and ``size``:
 * webdataset's TarWriter gives every member a pax ``mtime``). The Python reader then reads the one header the scan
 * stopped at (with its errors), so every error and every unusual tar is handled by one implementation only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define BLOCK 512
#define MAX_MEMBER (1LL << 28) /* reader._MAX_MEMBER */

/* An octal header field as reader._number reads it: up to its first NUL, ASCII whitespace stripped, octal
 * digits only (empty: 0). Returns 0 and sets *out, or -1 for anything else (base-256, a sign, 8 or 9, ...). */
static int octal(const unsigned char *field, Py_ssize_t n, long long *out) {
    Py_ssize_t a = 0, b = 0;
    while (b < n && field[b] != 0) b++;
    if (n > 0 && field[0] == 0x80) return -1;
    while (a < b && (field[a] == ' ' || (field[a] >= '\t' && field[a] <= '\r'))) a++;
    while (b > a && (field[b - 1] == ' ' || (field[b - 1] >= '\t' && field[b - 1] <= '\r'))) b--;
    long long v = 0;
    for (Py_ssize_t i = a; i < b; i++) {
        if (field[i] < '0' || field[i] > '7' || v > (1LL << 50)) return -1;
        v = v * 8 + (field[i] - '0');
    }
    *out = v;
    return 0;
}

/* The header's checksum holds: its stored value equals the byte sum with the checksum field as 8 spaces, the
 * bytes read unsigned (POSIX) or signed (old tars). */
static int checksum_ok(const unsigned char *h) {
    long long stored;
    if (octal(h + 148, 8, &stored) < 0) return 0;
    long long sum = 8 * 32, high = 0;
    for (int i = 0; i < BLOCK; i++) {
        if (i >= 148 && i < 156) continue;
        sum += h[i];
        high += h[i] > 127;
    }
    return stored == sum || stored == sum - 256 * high;
}

/* A pax extended header's records (``length key=value\n``) as reader._pax_records reads them, none of them a
 * ``path`` or a ``size`` (the records the reader applies): the header then changes nothing. 0 if so, -1 for
 * anything else (a record the Python reader applies, or one it refuses). */
static int pax_inert(const unsigned char *data, Py_ssize_t n) {
    Py_ssize_t pos = 0;
    while (pos < n) {
        const unsigned char *space = memchr(data + pos, ' ', n - pos);
        if (!space || space == data + pos) return -1;
        Py_ssize_t sp = space - data, length = 0;
        for (Py_ssize_t i = pos; i < sp; i++) {
            if (data[i] < '0' || data[i] > '9' || length > n) return -1;
            length = length * 10 + (data[i] - '0');
        }
        Py_ssize_t end = pos + length;
        if (end <= sp || end > n) return -1;
        const unsigned char *key = data + sp + 1; /* the key: up to the first '=' of the record less its last byte */
        Py_ssize_t body = end - 1 - (sp + 1) > 0 ? end - 1 - (sp + 1) : 0;
        const unsigned char *eq = memchr(key, '=', (size_t)body);
        Py_ssize_t klen = eq ? eq - key : body;
        if (klen == 4 && (memcmp(key, "path", 4) == 0 || memcmp(key, "size", 4) == 0)) return -1;
        pos = end;
    }
    return 0;
}

/* The member name (with the USTAR prefix) into name[], its length returned. */
static Py_ssize_t member_name(const unsigned char *h, char *name) {
    Py_ssize_t n = 0, len = 0;
    if (memcmp(h + 257, "ustar\0", 6) == 0 && h[345]) {
        while (n < 155 && h[345 + n]) n++;
        memcpy(name, h + 345, n);
        name[n++] = '/';
    }
    while (len < 100 && h[len]) len++;
    memcpy(name + n, h, len);
    return n + len;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, end, phase, step;
    PyObject *exts, *state;
    if (!PyArg_ParseTuple(args, "y*nnO!nnO!", &view, &pos, &end, &PyFrozenSet_Type, &exts, &phase, &step,
                          &PyList_Type, &state))
        return NULL;
    PyObject *samples = NULL, *result = NULL;
    if (PyList_GET_SIZE(state) != 4 || step < 1 || pos < 0 || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "scan: bad state or bounds");
        goto done;
    }
    samples = PyList_New(0);
    if (!samples) goto done;
    /* the open sample: borrowed from state until written back */
    PyObject *key = PyList_GET_ITEM(state, 0), *group = PyList_GET_ITEM(state, 1);
    int keeps = PyObject_IsTrue(PyList_GET_ITEM(state, 2));
    Py_ssize_t seen = PyLong_AsSsize_t(PyList_GET_ITEM(state, 3));
    if (keeps < 0 || (seen == -1 && PyErr_Occurred()) || !PyDict_Check(group)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "scan: bad state");
        goto done;
    }
    Py_INCREF(key);
    Py_INCREF(group);
    const unsigned char *buf = view.buf;
    char name[256 + 1];
    int failed = 0;
    while (pos + BLOCK <= end) {
        const unsigned char *h = buf + pos;
        char kind = (char)h[156];
        long long size;
        if (!checksum_ok(h) || octal(h + 124, 12, &size) < 0) break; /* a zero block fails it too */
        Py_ssize_t next = pos + BLOCK + (Py_ssize_t)(size + (-size & (BLOCK - 1)));
        if (size > end || next > end) break; /* not whole in the buffer */
        if (kind == 'L' || kind == 'K' || kind == 'x' || kind == 'g') { /* about the next member, or the archive */
            if (kind == 'L' || size > MAX_MEMBER || (kind == 'x' && pax_inert(h + BLOCK, (Py_ssize_t)size) < 0))
                break;
            pos = next; /* one that changes nothing (a pax mtime, a global header, a long link name): read past */
            continue;
        }
        if (kind != '0' && kind != '\0' && kind != '7') { /* a directory, a link, ...: read past */
            pos = next;
            continue;
        }
        Py_ssize_t len = member_name(h, name), slash = len, dot = -1;
        while (slash > 0 && name[slash - 1] != '/') slash--;
        for (Py_ssize_t i = slash; i < len; i++)
            if (name[i] == '.') {
                dot = i;
                break;
            }
        if (dot <= slash) { /* no extension: not a sample member */
            pos = next;
            continue;
        }
        PyObject *ext = PyUnicode_DecodeUTF8(name + dot + 1, len - dot - 1, "surrogateescape");
        if (!ext) { failed = 1; break; }
        int wanted = PySet_Contains(exts, ext);
        if (wanted <= 0) {
            Py_DECREF(ext);
            if (wanted < 0) { failed = 1; break; }
            pos = next;
            continue;
        }
        PyObject *prefix = PyUnicode_DecodeUTF8(name, dot, "surrogateescape");
        if (!prefix) { Py_DECREF(ext); failed = 1; break; }
        int same = key != Py_None ? PyUnicode_Compare(prefix, key) == 0 : 0;
        if (PyErr_Occurred()) { Py_DECREF(ext); Py_DECREF(prefix); failed = 1; break; }
        int kept = same ? keeps : (int)(seen % step == phase);
        if (kept && (size > MAX_MEMBER || (same && PyDict_Contains(group, ext)))) { /* the Python reader raises */
            Py_DECREF(ext);
            Py_DECREF(prefix);
            break;
        }
        if (!same) {
            if (PyDict_GET_SIZE(group)) {
                PyObject *done_sample = PyTuple_Pack(2, key, group);
                if (!done_sample || PyList_Append(samples, done_sample) < 0) {
                    Py_XDECREF(done_sample); Py_DECREF(ext); Py_DECREF(prefix); failed = 1; break;
                }
                Py_DECREF(done_sample);
            }
            PyObject *fresh = PyDict_New();
            if (!fresh) { Py_DECREF(ext); Py_DECREF(prefix); failed = 1; break; }
            Py_SETREF(group, fresh);
            Py_SETREF(key, prefix);
            prefix = NULL;
            seen += 1;
            keeps = kept;
        }
        Py_XDECREF(prefix);
        if (kept) {
            PyObject *data = PyBytes_FromStringAndSize((const char *)h + BLOCK, (Py_ssize_t)size);
            if (!data || PyDict_SetItem(group, ext, data) < 0) {
                Py_XDECREF(data); Py_DECREF(ext); failed = 1; break;
            }
            Py_DECREF(data);
        }
        Py_DECREF(ext);
        pos = next;
    }
    /* the open sample back into state (also after a failure: what was grouped stays consistent with pos) */
    PyObject *keeps_obj = PyBool_FromLong(keeps), *seen_obj = PyLong_FromSsize_t(seen);
    if (!seen_obj) { Py_DECREF(key); Py_DECREF(group); goto done; }
    PyList_SetItem(state, 0, key);  /* steals */
    PyList_SetItem(state, 1, group);
    PyList_SetItem(state, 2, keeps_obj);
    PyList_SetItem(state, 3, seen_obj);
    if (!failed) result = Py_BuildValue("nO", pos, samples);
done:
    Py_XDECREF(samples);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(buf, pos, end, exts, phase, step, state) -> (pos, samples)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tarscan", "Plain tar members into samples, in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tarscan(void) { return PyModule_Create(&module); }
