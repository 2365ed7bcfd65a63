/* wsishard's one native module (wsishard._native), built with the package, mandatory, with no Python twin. It holds
 * what measurably pays for itself (side by side, a user-facing figure at least 5% better with it than without;
 * figures in the commit that made this module and the docs' performance page):
 */
/* 1. scan: the common case of wsishard.shards.reader.TarSamples in C: plain tar members grouped into samples.
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
/* 2. lut_apply: GpuCollate's pass on a CPU device in C: every sample of a uint8 (b, h, w, 3) batch moved by its dihedral
 * transform and written through per-channel tables of the 256 values into the output, in one pass.
 *
 * lut_apply(src, dst, table, codes, b, h, w, itemsize, channels_last) -> None
 *
 *   src       C-contiguous buffer of the (b, h, w, 3) uint8 batch
 *   dst       writable C-contiguous buffer of the output: (b, 3, h, w) elements of ``itemsize`` bytes, or
 *             (b, h, w, 3) when ``channels_last``
 *   table     C-contiguous (3, 256) elements of ``itemsize`` bytes: per channel, the output bits of each value
 *   codes     ``b`` bytes, each sample's dihedral code as wsishard.streaming.collate.dihedral reads it: bit 0
 *             transposes (square samples only), bit 1 flips width, bit 2 flips height
 *
 * The output is the table's bits, so it is the plain reference's ((x / 255 - mean) / std in float32) bit for bit.
 * The output is written with non-temporal stores: it is far larger than any cache (200 MB of float32 for 256
 * patches of 256 px), and plain stores would first read every line of it. The GIL is released while it runs.
 */
/* 3. stain_apply: GpuCollate(stain=...)'s pass on a CPU device (wsishard.augment.stain_cpu): Macenko with each
 * sample's slide matrix, HED jitter, brightness, contrast and saturation, then (x - mean) / std, in one pass per
 * sample, with the torch path's float32 results (within float32 rounding: measured at most 2e-6 of full scale).
 *
 * stain_apply(src, dst, table, params, codes, norm, b, h, w, logs, lo, channels_last) -> None
 *
 *   src       C-contiguous buffer of the (b, h, w, 3) uint8 batch
 *   dst       writable C-contiguous float32 buffer of the output, (b, 3, h, w), or (b, h, w, 3) when
 *             ``channels_last``
 *   table     256 float32: each uint8 value's start (ln(v + 1) for Macenko, ln(max(v / 255, 1e-6)) for HED jitter
 *             alone, v / 255 without either), the same for the three channels
 *   params    (b, 27) float32, each sample's stain_params (below): identity maps and factors of 1 where an
 *             operation is off
 *   codes     ``b`` bytes, each sample's dihedral code (as lut_apply's)
 *   norm      6 float32: mean, then std, per channel
 *   logs      whether the log-space maps and exp run (Macenko or HED jitter on)
 *   lo        the clip of the first map's output from below (ln 1e-6 when HED jitter follows, else -87)
 *
 * Per pixel: x = table[v] per channel; with ``logs``, y = clip(A1 x + k1, lo, 0), z = A2 y + k2, x = exp(min(z, 0))
 * (as 2^, A2 and k2 times log2(e));
 * then x = min(x * brightness, 1). Per sample, once pass 1 has its grey mean m: x = clip(c x + (1 - c) m, 0, 1),
 * x = clip(s x + (1 - s) grey(x), 0, 1), out = (x - mean) / std (as x / std - mean / std, by reciprocals). The GIL
 * is released while it runs.
 */
/* 4. rank_median: the tissue scan's median blur, exactly scikit-image's ``filters.rank.median`` on a uint8 image
 * (so that the build does not import scikit-image and SciPy, 0.5 s of a build's start-up).
 *
 * rank_median(src, dst, h, w, halfwidths) -> None
 *
 *   src         C-contiguous (h, w) uint8 image
 *   dst         writable C-contiguous (h, w) uint8 output (not src)
 *   halfwidths  int32 per footprint row, top to bottom (an odd count 2r + 1, centred): that row holds the pixels
 *               dx in [-halfwidth, halfwidth] (a disk, a square); a negative halfwidth: the row is empty
 *
 * Each output pixel is the smallest value v at which more than half of the footprint's pixels that lie inside the
 * image are <= v (scikit-image's rule: pixels outside the image are not counted). A histogram slides along each
 * row; the median is found through 16 coarse bins.
 */
/* 5. quality_counts: the counts behind a patch's quality scores (wsishard.builder.extract.quality), in one pass over its
 * sampled pixels instead of a dozen numpy passes.
 *
 * quality_counts(patch, ys, xs, glass_saturation, glass_value, dark_value) -> (glass, dark, lap_sum, lap_squares)
 *
 *   patch             an (H, W, 3) uint8 array, any strides (a view of a larger image)
 *   ys, xs            int32 each: the rows and the columns sampled (h and w of them, each within the patch)
 *   glass_saturation  a sampled pixel is glass when (hi - lo) * 100 < glass_saturation * hi and hi > glass_value,
 *                     hi and lo its largest and smallest channel (the doubles compared as numpy compares them)
 *   dark_value        a sampled pixel is dark when hi < dark_value
 *
 * lap_sum and lap_squares: the sum and the sum of squares of the 4-neighbour Laplacian of hi over the inner
 * (h - 2) x (w - 2) sampled pixels (exact integers).
 */
/* 6. hsv_planes: the HSV planes the tissue scan's artefact and stain steps read (wsishard.builder.scan.artefacts), in one
 * pass, bit for bit what the numpy expressions there gave (float32 throughout: the same operations in the same
 * order, numpy's remainder for the hue's modulo).
 *
 * hsv_planes(rgb, hue, sat, val, n) -> None
 *
 *   rgb             C-contiguous n x 3 uint8
 *   hue, sat, val   writable C-contiguous n float32 each: hue in degrees [0, 360) (0 for grey), saturation
 *                   delta / max(hi, 1) (0 at black), value hi / 255
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

/* ---- 2. lut_apply ---------------------------------------------------------------------------------------- */

#if defined(__SSE2__)
/* 16 bytes of consecutive output elements V(k), V(k + 1), ... in one register, by element size */
#define VEC_uint8_t(V, k)                                                                                      \
    _mm_setr_epi8((char)V(k), (char)V((k) + 1), (char)V((k) + 2), (char)V((k) + 3), (char)V((k) + 4),         \
                  (char)V((k) + 5), (char)V((k) + 6), (char)V((k) + 7), (char)V((k) + 8), (char)V((k) + 9),   \
                  (char)V((k) + 10), (char)V((k) + 11), (char)V((k) + 12), (char)V((k) + 13),                 \
                  (char)V((k) + 14), (char)V((k) + 15))
#define VEC_uint16_t(V, k)                                                                                     \
    _mm_setr_epi16((short)V(k), (short)V((k) + 1), (short)V((k) + 2), (short)V((k) + 3), (short)V((k) + 4),   \
                   (short)V((k) + 5), (short)V((k) + 6), (short)V((k) + 7))
#define VEC_uint32_t(V, k) _mm_setr_epi32((int)V(k), (int)V((k) + 1), (int)V((k) + 2), (int)V((k) + 3))
#define VEC_uint64_t(V, k) _mm_set_epi64x((long long)V((k) + 1), (long long)V(k))

/* The n elements V(0) ... V(n - 1) of an output row into dst, straight from registers to memory with
 * non-temporal stores, 16 bytes at a time where dst is aligned. (A row built in a buffer and then copied reads
 * back wide what was just written narrow, which stalls: about 1.7x slower here.) */
#define STORE_ROW(T, V)                                                                                        \
    do {                                                                                                       \
        const Py_ssize_t lanes = 16 / (Py_ssize_t)sizeof(T);                                                   \
        Py_ssize_t k = 0;                                                                                      \
        for (; k < n && ((uintptr_t)(dst + k) & 15); k++) dst[k] = V(k);                                       \
        for (; k + lanes <= n; k += lanes) _mm_stream_si128((__m128i *)(dst + k), VEC_##T(V, k));              \
        for (; k < n; k++) dst[k] = V(k);                                                                      \
    } while (0)
#else
#define STORE_ROW(T, V)                                                                                        \
    do {                                                                                                       \
        for (Py_ssize_t k = 0; k < n; k++) dst[k] = V(k);                                                      \
    } while (0)
#endif

/* Element k of a planar row: one channel, its table t, p0 at that channel's byte of the row's first source pixel,
 * step bytes to the next pixel. */
#define PLANAR(k) t[p0[(k) * step]]
/* Element j of an interleaved run of pixels from q (pixel j / 3, channel j % 3; j a constant, so both fold) */
#define MIXED(j) t[256 * ((j) % 3) + q[((j) / 3) * step + (j) % 3]]
#define LANES_uint8_t 16
#define LANES_uint16_t 8
#define LANES_uint32_t 4
#define LANES_uint64_t 2

/* Built for the baseline and for x86-64-v2, chosen when loaded: SSE4.1 puts an element into a register in one
 * instruction (pinsrd), where SSE2 needs a move and a shuffle (about 1.3x slower here). */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONES __attribute__((target_clones("default", "arch=x86-64-v2")))
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

/* An interleaved row (channels_last): w pixels, 3 elements each. Where dst is aligned, LANES pixels at a time
 * make three registers of elements, stored past the cache; the rest one element at a time. */
#if defined(__SSE2__)
#define MIXED_GROUPS(T)                                                                                        \
    if (((uintptr_t)dst & 15) == 0) {                                                                          \
        for (; x + LANES_##T <= w; x += LANES_##T) {                                                           \
            const uint8_t *q = p0 + x * step;                                                                  \
            T *o = dst + 3 * x;                                                                                \
            _mm_stream_si128((__m128i *)o, VEC_##T(MIXED, 0));                                                 \
            _mm_stream_si128((__m128i *)(o + LANES_##T), VEC_##T(MIXED, LANES_##T));                           \
            _mm_stream_si128((__m128i *)(o + 2 * LANES_##T), VEC_##T(MIXED, 2 * LANES_##T));                   \
        }                                                                                                      \
    }
#else
#define MIXED_GROUPS(T)
#endif

#define ROWS(T)                                                                                                \
    CLONES static void planar_##T(void *out, const void *table, const uint8_t *p0, Py_ssize_t step,            \
                                  Py_ssize_t n) {                                                              \
        T *dst = out;                                                                                          \
        const T *t = table;                                                                                    \
        STORE_ROW(T, PLANAR);                                                                                  \
    }                                                                                                          \
    CLONES static void mixed_##T(void *out, const void *table, const uint8_t *p0, Py_ssize_t step,             \
                                 Py_ssize_t w) {                                                               \
        T *dst = out;                                                                                          \
        const T *t = table;                                                                                    \
        Py_ssize_t x = 0;                                                                                      \
        MIXED_GROUPS(T)                                                                                        \
        for (; x < w; x++) {                                                                                   \
            const uint8_t *q = p0 + x * step;                                                                  \
            dst[3 * x] = t[q[0]];                                                                              \
            dst[3 * x + 1] = t[256 + q[1]];                                                                    \
            dst[3 * x + 2] = t[512 + q[2]];                                                                    \
        }                                                                                                      \
    }
ROWS(uint8_t)
ROWS(uint16_t)
ROWS(uint32_t)
ROWS(uint64_t)

typedef void (*row_fn)(void *, const void *, const uint8_t *, Py_ssize_t, Py_ssize_t);

/* The n x n pixels (3 bytes each) of src transposed into dst, in tiles that stay in cache: read column by column
 * straight from src, every pixel of an output row would be on a cache line of its own. */
static void transpose(uint8_t *dst, const uint8_t *src, Py_ssize_t n) {
    const Py_ssize_t tile = 32;
    for (Py_ssize_t i0 = 0; i0 < n; i0 += tile) {
        for (Py_ssize_t j0 = 0; j0 < n; j0 += tile) {
            Py_ssize_t i1 = i0 + tile < n ? i0 + tile : n, j1 = j0 + tile < n ? j0 + tile : n;
            for (Py_ssize_t i = i0; i < i1; i++) {
                for (Py_ssize_t j = j0; j < j1; j++) memcpy(dst + 3 * (i * n + j), src + 3 * (j * n + i), 3);
            }
        }
    }
}

/* A sample's output rows. Output pixel (oy, ox) is the source pixel (y1, x1) with y1 = oy or h - 1 - oy (bit 2),
 * x1 = ox or w - 1 - ox (bit 1), of the sample transposed first (bit 0, square samples only): as dihedral(). */
static void one_sample(uint8_t *d, const uint8_t *s, const uint8_t *table, int itemsize, int code, Py_ssize_t h,
                       Py_ssize_t w, int channels_last, uint8_t *scratch) {
    static const row_fn planar[9] = {NULL, planar_uint8_t, planar_uint16_t, NULL, planar_uint32_t,
                                     NULL, NULL, NULL, planar_uint64_t};
    static const row_fn mixed[9] = {NULL, mixed_uint8_t, mixed_uint16_t, NULL, mixed_uint32_t,
                                    NULL, NULL, NULL, mixed_uint64_t};
    int fw = (code & 2) != 0, fh = (code & 4) != 0;
    size_t plane = (size_t)h * w * itemsize, line = (size_t)w * itemsize;
    if ((code & 1) && h == w) { /* transposed first, then read as any other sample */
        transpose(scratch, s, w);
        s = scratch;
    }
    const Py_ssize_t pixel = 3, across = 3 * w; /* source bytes to the next x1, to the next y1 */
    for (Py_ssize_t oy = 0; oy < h; oy++) {
        Py_ssize_t y1 = fh ? h - 1 - oy : oy;
        const uint8_t *p0 = s + y1 * across + (fw ? (w - 1) * pixel : 0);
        Py_ssize_t step = fw ? -pixel : pixel;
        if (channels_last) {
            mixed[itemsize](d + 3 * line * oy, table, p0, step, w);
            continue;
        }
        for (int c = 0; c < 3; c++) planar[itemsize](d + c * plane + line * oy, table + 256 * c * itemsize, p0 + c,
                                                     step, w);
    }
}

static PyObject *lut_apply(PyObject *self, PyObject *args) {
    Py_buffer src, dst, table, codes;
    Py_ssize_t b, h, w;
    int itemsize, channels_last;
    if (!PyArg_ParseTuple(args, "y*w*y*y*nnnip", &src, &dst, &table, &codes, &b, &h, &w, &itemsize,
                          &channels_last))
        return NULL;
    PyObject *result = NULL;
    uint8_t *scratch = NULL, *code = NULL; /* a transposed sample; the codes */
    if (b <= 0 || h <= 0 || w <= 0 || (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "apply: b, h, w must be positive and itemsize 1, 2, 4 or 8");
        goto done;
    }
    /* (y* and w* take C-contiguous buffers only) */
    if (src.len / b / h / w != 3 || src.len != b * h * w * 3 || dst.len != src.len * itemsize ||
        table.len != 3 * 256 * itemsize || codes.len != b) {
        PyErr_SetString(PyExc_ValueError, "apply: buffers not of the sizes b, h, w give");
        goto done;
    }
    if (((uintptr_t)table.buf % itemsize) != 0 || ((uintptr_t)dst.buf % itemsize) != 0) {
        PyErr_SetString(PyExc_ValueError, "apply: the table or the output is not aligned to its elements");
        goto done;
    }
    /* the codes copied, then checked and used: the caller's buffer may change while the GIL is released */
    if ((code = PyMem_RawMalloc((size_t)b)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(code, codes.buf, (size_t)b);
    for (Py_ssize_t i = 0; i < b; i++) {
        if (code[i] > 7) {
            PyErr_SetString(PyExc_ValueError, "apply: a dihedral code outside [0, 8)");
            goto done;
        }
    }
    size_t in = (size_t)h * w * 3, out = in * itemsize;
    if (h == w) {
        for (Py_ssize_t i = 0; i < b && scratch == NULL; i++) {
            if (code[i] & 1 && (scratch = PyMem_RawMalloc(in)) == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *table_bits = table.buf;
    for (Py_ssize_t i = 0; i < b; i++)
        one_sample((uint8_t *)dst.buf + out * i, (const uint8_t *)src.buf + in * i, table_bits, itemsize, code[i], h,
                   w, channels_last, scratch);
#if defined(__SSE2__)
    _mm_sfence(); /* the non-temporal stores are seen before the batch is handed on */
#endif
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(scratch);
    PyMem_RawFree(code);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&table);
    PyBuffer_Release(&codes);
    return result;
}

/* ---- 3. stain_apply -------------------------------------------------------------------------------------- */

/* Per-sample parameters of stain_apply, float32, in this order (STAIN_PARAMS of them a sample). */
typedef struct {
    float a1[9], k1[3]; /* Macenko: y = a1 x + k1 (log intensities; row major), clamped to [lo, 0] */
    float a2[9], k2[3]; /* HED jitter: z = a2 y + k2 (log intensities), clamped to <= 0; then exp */
    float bright, contrast, saturation;
} stain_params;
#define STAIN_PARAMS 27
_Static_assert(sizeof(stain_params) == STAIN_PARAMS * sizeof(float), "stain_params is 27 packed floats");

/* The stain pass's loops vectorise only where float operations are not taken to trap (GCC), and its clips become
 * single min and max instructions (not compares and blends: the whole pass 1.15x faster here) only where no operand is
 * taken to be a NaN, an infinity or a signed zero: none is (the tables and parameters are finite, every exp's
 * argument clipped). They are built for the baseline and for x86-64-v3 (AVX2, FMA), chosen when loaded. */
#if defined(__GNUC__) && !defined(__clang__)
#define FLOATS __attribute__((optimize("no-trapping-math", "no-signed-zeros", "finite-math-only")))
#else
#define FLOATS
#endif
/* target_clones needs the loader's ifunc (glibc) and a GCC that knows x86-64-v3 (12 is what CI builds with); any
 * other compiler or libc builds the baseline only. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define CLONES3 FLOATS __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define CLONES3 FLOATS
#endif
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PREFETCH(a) __builtin_prefetch((a), 0, 3)
#else
#define ALWAYS_INLINE inline
#define PREFETCH(a) ((void)(a))
#endif

/* 2^f on [-1/2, 1/2] by a degree-5 polynomial, lowest degree first: a fit of e^r's relative error on
 * [-ln 2 / 2, ln 2 / 2], its coefficients times ln(2)^k (at most 1.9e-7 of the result in float32). */
static const float EXP2_POLY[6] = {1.0000001192092896f, 6.931470036506653e-1f,  2.4022118747234344e-1f,
                                   5.550713837146759e-2f, 9.675540030002594e-3f, 1.3276288518682122e-3f};

/* 2^t for t <= 0 (below -125 as -125: 2.4e-38) times a factor e carries (e: EXP2_POLY times it), in plain float
 * arithmetic that vectorises: t = n + f with n the nearest integer (the round-to-nearest of adding 1.5 2^23, biased
 * by 127 so that the sum's low bits shifted into the exponent are 2^n), 2^f by the polynomial. */
FLOATS static ALWAYS_INLINE float exp2_neg(float t, const float *e) {
    t = t > -125.0f ? t : -125.0f;
    float big = t + 12583039.0f; /* 1.5 2^23 + 127: its low bits are n + 127 */
    float f = t - (big - 12583039.0f);
    float p = e[4] + e[5] * f;
    p = e[3] + p * f;
    p = e[2] + p * f;
    p = e[1] + p * f;
    p = e[0] + p * f;
    int32_t bits;
    memcpy(&bits, &big, sizeof bits);
    bits = (int32_t)((uint32_t)bits << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Pass 1 on one pixel, its inputs x0, x1, x2 (the table's values of its uint8 channels) in place: through both
 * log-space maps and exp (``logs``, a constant where inlined; ``m`` and ``c`` are the second map's times log2(e), so
 * that exp is 2^), or as they are; then times the brightness (``e``: EXP2_POLY times it, with ``logs``), capped at
 * 1. The clips are written as x86's min and max read (a < b ? a : b), which the compiler then uses. */
FLOATS static ALWAYS_INLINE void stain_pixel(float *restrict x0, float *restrict x1, float *restrict x2,
                                             const stain_params *p, int logs, float lo, const float *e) {
    const float *a = p->a1, *k = p->k1, *m = p->a2, *c = p->k2, f = p->bright;
    float v0 = *x0, v1 = *x1, v2 = *x2;
    if (logs) {
        float y0 = k[0] + a[0] * v0 + a[1] * v1 + a[2] * v2;
        float y1 = k[1] + a[3] * v0 + a[4] * v1 + a[5] * v2;
        float y2 = k[2] + a[6] * v0 + a[7] * v1 + a[8] * v2;
        y0 = y0 < 0.0f ? y0 : 0.0f;
        y1 = y1 < 0.0f ? y1 : 0.0f;
        y2 = y2 < 0.0f ? y2 : 0.0f;
        y0 = y0 > lo ? y0 : lo;
        y1 = y1 > lo ? y1 : lo;
        y2 = y2 > lo ? y2 : lo;
        float t0 = c[0] + m[0] * y0 + m[1] * y1 + m[2] * y2;
        float t1 = c[1] + m[3] * y0 + m[4] * y1 + m[5] * y2;
        float t2 = c[2] + m[6] * y0 + m[7] * y1 + m[8] * y2;
        v0 = exp2_neg(t0 < 0.0f ? t0 : 0.0f, e);
        v1 = exp2_neg(t1 < 0.0f ? t1 : 0.0f, e);
        v2 = exp2_neg(t2 < 0.0f ? t2 : 0.0f, e);
    } else {
        v0 *= f;
        v1 *= f;
        v2 *= f;
    }
    *x0 = v0 < 1.0f ? v0 : 1.0f;
    *x1 = v1 < 1.0f ? v1 : 1.0f;
    *x2 = v2 < 1.0f ? v2 : 1.0f;
}

/* Pass 1 on a row of n pixels (stain_pixel on each), then the row's sum of grey (eight partial sums, so that the
 * loop vectorises without reassociating floats). */
FLOATS static ALWAYS_INLINE double stain_pixels(float *restrict l0, float *restrict l1, float *restrict l2,
                                                Py_ssize_t n, const stain_params *p, int logs, float lo) {
    float e[6];
    for (int j = 0; j < 6; j++) e[j] = EXP2_POLY[j] * p->bright;
    for (Py_ssize_t i = 0; i < n; i++) stain_pixel(l0 + i, l1 + i, l2 + i, p, logs, lo, e);
    float part[8] = {0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += l0[i + j] * 0.2989f + l1[i + j] * 0.587f + l2[i + j] * 0.114f;
    double sum = 0.0;
    for (; i < n; i++) sum += l0[i] * 0.2989f + l1[i] * 0.587f + l2[i] * 0.114f;
    for (int j = 0; j < 8; j++) sum += part[j];
    return sum;
}
CLONES3 static double stain_row(float *restrict l0, float *restrict l1, float *restrict l2, Py_ssize_t n,
                                const stain_params *p, int logs, float lo) {
    return logs ? stain_pixels(l0, l1, l2, n, p, 1, lo) : stain_pixels(l0, l1, l2, n, p, 0, lo);
}

/* Pass 2 on a sample's n pixels (planes s0, s1, s2): contrast towards the grey mean, saturation towards each
 * pixel's grey (each clipped to [0, 1], torchvision's _blend), then (x - mean) / std into the output: planes d, d +
 * plane, d + 2 plane (``step`` 1), or interleaved (``plane`` 1, ``step`` 3). Inlined into one function per layout,
 * where plane and step are constants the compiler vectorises with. */
FLOATS static ALWAYS_INLINE void finish(float *restrict d, Py_ssize_t plane, Py_ssize_t step,
                                        const float *restrict s0, const float *restrict s1,
                                        const float *restrict s2, Py_ssize_t n,
                                        const stain_params *p, float grey_mean, const float *norm) {
    const float ct = p->contrast, cm = (1.0f - ct) * grey_mean, sa = p->saturation, sg = 1.0f - sa;
    const float v0 = 1.0f / norm[3], v1 = 1.0f / norm[4], v2 = 1.0f / norm[5];
    const float m0 = norm[0] * v0, m1 = norm[1] * v1, m2 = norm[2] * v2;
    for (Py_ssize_t i = 0; i < n; i++) {
        float x0 = ct * s0[i] + cm, x1 = ct * s1[i] + cm, x2 = ct * s2[i] + cm;
        x0 = x0 > 1.0f ? 1.0f : (x0 < 0.0f ? 0.0f : x0);
        x1 = x1 > 1.0f ? 1.0f : (x1 < 0.0f ? 0.0f : x1);
        x2 = x2 > 1.0f ? 1.0f : (x2 < 0.0f ? 0.0f : x2);
        float g = sg * (x0 * 0.2989f + x1 * 0.587f + x2 * 0.114f);
        x0 = sa * x0 + g;
        x1 = sa * x1 + g;
        x2 = sa * x2 + g;
        x0 = x0 > 1.0f ? 1.0f : (x0 < 0.0f ? 0.0f : x0);
        x1 = x1 > 1.0f ? 1.0f : (x1 < 0.0f ? 0.0f : x1);
        x2 = x2 > 1.0f ? 1.0f : (x2 < 0.0f ? 0.0f : x2);
        d[i * step] = x0 * v0 - m0;
        d[i * step + plane] = x1 * v1 - m1;
        d[i * step + 2 * plane] = x2 * v2 - m2;
    }
}
/* m floats from src to dst with non-temporal stores where dst is aligned (SSE2): the output is far larger than any
 * cache, and plain stores would first read every line of it (as lut_apply's). The interleaved layout's pass 2 goes
 * through a run in L1 and this (0.85x its time with plain stores); the planar one stores straight from its loop,
 * which measured faster than through a run (1.06x with one here). */
static ALWAYS_INLINE void stream_floats(float *restrict dst, const float *restrict src, Py_ssize_t m) {
    Py_ssize_t k = 0;
#if defined(__SSE2__)
    for (; k < m && ((uintptr_t)(dst + k) & 15); k++) dst[k] = src[k];
    for (; k + 4 <= m; k += 4) _mm_stream_ps(dst + k, _mm_loadu_ps(src + k));
#endif
    for (; k < m; k++) dst[k] = src[k];
}
#define RUN 64 /* pixels finished into a buffer in L1, then streamed out */
CLONES3 static void finish_planar(float *d, const float *s, Py_ssize_t n, const stain_params *p, float grey_mean,
                                  const float *norm) {
    finish(d, n, 1, s, s + n, s + 2 * n, n, p, grey_mean, norm);
}
CLONES3 static void finish_mixed(float *d, const float *s, Py_ssize_t n, const stain_params *p, float grey_mean,
                                 const float *norm) {
    float run[3 * RUN];
    for (Py_ssize_t i = 0; i < n; i += RUN) {
        Py_ssize_t m = n - i < RUN ? n - i : RUN;
        finish(run, 1, 3, s + i, s + n + i, s + 2 * n + i, m, p, grey_mean, norm);
        stream_floats(d + 3 * i, run, 3 * m);
    }
}

/* One sample: its dihedral move as one_sample's, pass 1 row by row into the planes of scratch (3 h w floats), pass 2
 * into d; meanwhile the next sample's bytes (``next``, or NULL) are fetched into the caches, a row's worth a row, so
 * that rows read in any order come from them (a flipped sample's pass: about 0.7x the time without). Output pixel
 * (oy, ox) is the source pixel (y1, x1) (y1 = oy or h - 1 - oy, x1 = ox or w - 1 - ox, by bits 2 and 1), or (x1, y1)
 * when transposed (bit 0, square samples): read down a column, whose lines stay in cache from one output row to the
 * next. */
static void stain_sample(float *d, const uint8_t *s, const float *table, const stain_params *p, int code,
                         Py_ssize_t h, Py_ssize_t w, int channels_last, int logs, float lo, const float *norm,
                         float *scratch, const uint8_t *next) {
    int fw = (code & 2) != 0, fh = (code & 4) != 0, tr = (code & 1) && h == w;
    Py_ssize_t n = h * w, pixel = tr ? 3 * w : 3, across = tr ? 3 : 3 * w; /* to the next x1; to the next y1 */
    Py_ssize_t ahead = (3 * w + 63) / 64 * 64; /* bytes of the next sample fetched a row */
    double grey = 0.0;
    for (Py_ssize_t oy = 0; oy < h; oy++) {
        if (next != NULL) {
            for (Py_ssize_t k = oy * ahead; k < (oy + 1) * ahead && k < 3 * n; k += 64) PREFETCH(next + k);
        }
        const uint8_t *p0 = s + (fh ? h - 1 - oy : oy) * across + (fw ? (w - 1) * pixel : 0);
        Py_ssize_t step = fw ? -pixel : pixel;
        float *r0 = scratch + oy * w, *r1 = r0 + n, *r2 = r1 + n;
        for (Py_ssize_t x = 0; x < w; x++) {
            const uint8_t *q = p0 + x * step;
            r0[x] = table[q[0]];
            r1[x] = table[q[1]];
            r2[x] = table[q[2]];
        }
        grey += stain_row(r0, r1, r2, w, p, logs, lo);
    }
    (channels_last ? finish_mixed : finish_planar)(d, scratch, n, p, (float)(grey / (double)n), norm);
}

static PyObject *stain_apply(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, dst, table, params, codes, norm;
    Py_ssize_t b, h, w;
    int logs, channels_last;
    float lo;
    if (!PyArg_ParseTuple(args, "y*w*y*y*y*y*nnnpfp", &src, &dst, &table, &params, &codes, &norm, &b, &h, &w,
                          &logs, &lo, &channels_last))
        return NULL;
    PyObject *result = NULL;
    float *scratch = NULL, *par = NULL;
    uint8_t *code = NULL;
    if (b <= 0 || h <= 0 || w <= 0 || src.len / b / h / w != 3 || src.len != b * h * w * 3 ||
        dst.len != src.len * 4 || table.len != 256 * 4 || params.len != b * STAIN_PARAMS * 4 || codes.len != b ||
        norm.len != 6 * 4) {
        PyErr_SetString(PyExc_ValueError, "stain_apply: buffers not of the sizes b, h, w give");
        goto done;
    }
    if (((uintptr_t)dst.buf % 4) != 0 || ((uintptr_t)table.buf % 4) != 0 || ((uintptr_t)norm.buf % 4) != 0) {
        PyErr_SetString(PyExc_ValueError, "stain_apply: a float buffer not aligned to its elements");
        goto done;
    }
    /* the codes and parameters copied, then checked and used: the caller's buffers may change without the GIL */
    code = PyMem_RawMalloc((size_t)b);
    par = PyMem_RawMalloc((size_t)params.len);
    scratch = PyMem_RawMalloc((size_t)h * w * 3 * sizeof(float));
    if (!code || !par || !scratch) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(code, codes.buf, (size_t)b);
    memcpy(par, params.buf, (size_t)params.len);
    for (Py_ssize_t i = 0; i < b; i++) {
        if (code[i] > 7) {
            PyErr_SetString(PyExc_ValueError, "stain_apply: a dihedral code outside [0, 8)");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS;
    float t[256], nm[6];
    memcpy(t, table.buf, sizeof t);
    memcpy(nm, norm.buf, sizeof nm);
    for (Py_ssize_t i = 0; i < b; i++) {
        stain_params p;
        memcpy(&p, par + STAIN_PARAMS * i, sizeof p);
        for (int j = 0; j < 9; j++) p.a2[j] *= 1.44269504f; /* z in units of ln 2: exp2_neg */
        for (int j = 0; j < 3; j++) p.k2[j] *= 1.44269504f;
        const uint8_t *sample = (const uint8_t *)src.buf + 3 * h * w * i;
        stain_sample((float *)dst.buf + 3 * h * w * i, sample, t, &p, code[i], h, w, channels_last, logs, lo, nm,
                     scratch, i + 1 < b ? sample + 3 * h * w : NULL);
    }
#if defined(__SSE2__)
    _mm_sfence(); /* the non-temporal stores are seen before the batch is handed on */
#endif
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(code);
    PyMem_RawFree(par);
    PyMem_RawFree(scratch);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&table);
    PyBuffer_Release(&params);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&norm);
    return result;
}

static void median_row(const uint8_t *src, uint8_t *dst, Py_ssize_t h, Py_ssize_t w, const int32_t *hw, Py_ssize_t r,
                       Py_ssize_t y) {
    uint32_t fine[256] = {0}, coarse[16] = {0}, pop = 0;
    for (Py_ssize_t dy = -r; dy <= r; dy++) { /* the footprint at x = 0 */
        Py_ssize_t yy = y + dy, half = hw[dy + r];
        if (yy < 0 || yy >= h || half < 0) continue;
        const uint8_t *row = src + yy * w;
        for (Py_ssize_t xx = 0; xx <= half && xx < w; xx++) {
            fine[row[xx]]++;
            coarse[row[xx] >> 4]++;
            pop++;
        }
    }
    for (Py_ssize_t x = 0; x < w; x++) {
        uint32_t cum = 0, c = 0;
        while (2 * (cum + coarse[c]) <= pop) cum += coarse[c++]; /* pop > 0: the centre is always inside */
        uint32_t v = c << 4;
        while (2 * (cum + fine[v]) <= pop) cum += fine[v++];
        dst[y * w + x] = (uint8_t)v;
        for (Py_ssize_t dy = -r; dy <= r; dy++) { /* slide to x + 1 */
            Py_ssize_t yy = y + dy, half = hw[dy + r];
            if (yy < 0 || yy >= h || half < 0) continue;
            const uint8_t *row = src + yy * w;
            Py_ssize_t out = x - half, in = x + 1 + half;
            if (out >= 0) {
                fine[row[out]]--;
                coarse[row[out] >> 4]--;
                pop--;
            }
            if (in < w) {
                fine[row[in]]++;
                coarse[row[in] >> 4]++;
                pop++;
            }
        }
    }
}

static PyObject *rank_median(PyObject *self, PyObject *args) {
    Py_buffer src, dst, halfwidths;
    Py_ssize_t h, w;
    if (!PyArg_ParseTuple(args, "y*w*nny*", &src, &dst, &h, &w, &halfwidths)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t rows = halfwidths.len / (Py_ssize_t)sizeof(int32_t), r = rows / 2;
    if (h <= 0 || w <= 0 || src.len != h * w || dst.len != h * w || src.buf == dst.buf) {
        PyErr_SetString(PyExc_ValueError, "rank_median: src and dst must be distinct buffers of h * w bytes");
        goto done;
    }
    if (rows % 2 != 1 || halfwidths.len % (Py_ssize_t)sizeof(int32_t) != 0 || ((int32_t *)halfwidths.buf)[r] < 0) {
        PyErr_SetString(PyExc_ValueError, "rank_median: halfwidths must be an odd number of int32 holding the centre");
        goto done;
    }
    const int32_t *hw = (const int32_t *)halfwidths.buf;
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t y = 0; y < h; y++) median_row(src.buf, dst.buf, h, w, hw, r, y);
    Py_END_ALLOW_THREADS result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&halfwidths);
    return result;
}

static PyObject *quality_counts(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_buffer patch = {0}, ys = {0}, xs = {0};
    double glass_saturation, glass_value, dark_value;
    if (!PyArg_ParseTuple(args, "Oy*y*ddd", &obj, &ys, &xs, &glass_saturation, &glass_value, &dark_value))
        return NULL;
    PyObject *result = NULL;
    int16_t *hi = NULL;
    if (PyObject_GetBuffer(obj, &patch, PyBUF_RECORDS_RO) < 0) goto done;
    Py_ssize_t h = ys.len / (Py_ssize_t)sizeof(int32_t), w = xs.len / (Py_ssize_t)sizeof(int32_t);
    if (patch.ndim != 3 || patch.itemsize != 1 || patch.shape[2] != 3 || h <= 0 || w <= 0) {
        PyErr_SetString(PyExc_ValueError, "quality_counts: patch must be (H, W, 3) uint8, ys and xs non-empty");
        goto done;
    }
    const int32_t *yi = ys.buf, *xi = xs.buf;
    for (Py_ssize_t i = 0; i < h; i++)
        if (yi[i] < 0 || yi[i] >= patch.shape[0]) {
            PyErr_SetString(PyExc_ValueError, "quality_counts: a sampled row lies outside the patch");
            goto done;
        }
    for (Py_ssize_t i = 0; i < w; i++)
        if (xi[i] < 0 || xi[i] >= patch.shape[1]) {
            PyErr_SetString(PyExc_ValueError, "quality_counts: a sampled column lies outside the patch");
            goto done;
        }
    hi = PyMem_Malloc((size_t)(h * w) * sizeof(int16_t));
    if (hi == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long glass = 0, dark = 0, lap_sum = 0, lap_squares = 0;
    const Py_ssize_t sy = patch.strides[0], sx = patch.strides[1], sc = patch.strides[2];
    for (Py_ssize_t y = 0; y < h; y++) {
        const uint8_t *row = (const uint8_t *)patch.buf + yi[y] * sy;
        for (Py_ssize_t x = 0; x < w; x++) {
            const uint8_t *p = row + xi[x] * sx;
            int r = p[0], g = p[sc], b = p[2 * sc];
            int mx = r > g ? r : g, mn = r < g ? r : g;
            mx = mx > b ? mx : b;
            mn = mn < b ? mn : b;
            hi[y * w + x] = (int16_t)mx;
            glass += ((double)((mx - mn) * 100) < glass_saturation * (double)mx) && ((double)mx > glass_value);
            dark += (double)mx < dark_value;
        }
    }
    for (Py_ssize_t y = 1; y + 1 < h; y++) {
        for (Py_ssize_t x = 1; x + 1 < w; x++) {
            const int16_t *c = hi + y * w + x;
            long long lap = (long long)c[-1] + c[1] + c[-w] + c[w] - 4 * (long long)c[0];
            lap_sum += lap;
            lap_squares += lap * lap;
        }
    }
    result = Py_BuildValue("LLLL", glass, dark, lap_sum, lap_squares);
done:
    PyMem_Free(hi);
    if (patch.obj != NULL) PyBuffer_Release(&patch);
    PyBuffer_Release(&ys);
    PyBuffer_Release(&xs);
    return result;
}

static PyObject *hsv_planes(PyObject *self, PyObject *args) {
    Py_buffer rgb, hue, sat, val;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*w*w*w*n", &rgb, &hue, &sat, &val, &n)) return NULL;
    PyObject *result = NULL;
    if (n < 0 || rgb.len != 3 * n || hue.len != 4 * n || sat.len != 4 * n || val.len != 4 * n) {
        PyErr_SetString(PyExc_ValueError, "hsv_planes: rgb must hold 3 * n bytes, the planes n float32 each");
        goto done;
    }
    const uint8_t *p = rgb.buf;
    float *h_out = hue.buf, *s_out = sat.buf, *v_out = val.buf;
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        float r = p[0], g = p[1], b = p[2];
        float hi = r > g ? r : g, lo = r < g ? r : g;
        hi = hi > b ? hi : b;
        lo = lo < b ? lo : b;
        float delta = hi - lo;
        float h = 0.0f;
        if (delta > 0) {
            float x; /* as numpy: (g - b) / delta, else 2 + (b - r) / delta, else 4 + (r - g) / delta */
            if (hi == r)
                x = (g - b) / delta;
            else if (hi == g)
                x = 2.0f + (b - r) / delta;
            else
                x = 4.0f + (r - g) / delta;
            x = x * 60.0f;
            h = fmodf(x, 360.0f); /* numpy's remainder: the sign of the divisor, +0 for an exact multiple */
            if (h != 0.0f) {
                if (h < 0.0f) h += 360.0f;
            } else {
                h = 0.0f;
            }
        }
        h_out[i] = h;
        s_out[i] = hi > 0 ? delta / (hi > 1.0f ? hi : 1.0f) : 0.0f;
        v_out[i] = hi / 255.0f;
    }
    Py_END_ALLOW_THREADS result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&rgb);
    PyBuffer_Release(&hue);
    PyBuffer_Release(&sat);
    PyBuffer_Release(&val);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(buf, pos, end, exts, phase, step, state) -> (pos, samples)"},
    {"lut_apply", lut_apply, METH_VARARGS, "lut_apply(src, dst, table, codes, b, h, w, itemsize, channels_last) -> None"},
    {"stain_apply", stain_apply, METH_VARARGS,
     "stain_apply(src, dst, table, params, codes, norm, b, h, w, logs, lo, channels_last) -> None"},
    {"rank_median", rank_median, METH_VARARGS, "rank_median(src, dst, h, w, halfwidths) -> None"},
    {"quality_counts", quality_counts, METH_VARARGS,
     "quality_counts(patch, ys, xs, glass_saturation, glass_value, dark_value) -> (glass, dark, lap_sum, lap_squares)"},
    {"hsv_planes", hsv_planes, METH_VARARGS, "hsv_planes(rgb, hue, sat, val, n) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "wsishard's native helpers: tar scan, GpuCollate's CPU pass, the scan's median, patch scores.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
