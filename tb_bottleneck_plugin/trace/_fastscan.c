/* One chunk of trace-event JSON (the text `events._decode_events` gets: an array of event
 * objects) -> per-event field values, without a Python object per event.
 *
 * Optional (setup.py builds it when a compiler is there; `native.py` uses it). It handles
 * only the clean, common case exactly and answers None for anything else, so that chunk
 * goes the msgspec way and every lenient rule stays in one place (events.py/columns.py):
 * a value of a type its field does not take (booleans, objects, lists where numbers go),
 * escapes in a string that is decoded (names, categories, keys), a lone surrogate escape or
 * invalid UTF-8 anywhere, control characters in strings, integers beyond int64, floats that
 * over- or underflow, nesting deeper than MAX_DEPTH, a key twice in one object, grid/block
 * that are not 3 integers >= -1, an `occupancy` object, anything after the array.
 *
 * scan(chunk, tail=False) -> (n, kinds, values, dims, texts, seen, end):
 *   kinds   bytes, uint8[NF][n]  per field (the order below, mirrored in native.py) and event:
 *           0 absent, 1 null, 2 int, 3 float, 4 string, 5 raw JSON value, 6 list of 3, 7 object
 *   values  list of NF bytes     per field, int64[n], one value per event: int: the value;
 *           float: its bits (a double); string / raw: the index of its text in texts (texts
 *           deduplicated by their bytes); absent or null: -1; else 0. b"" for a field no
 *           event has.
 *   dims    bytes, int64[n][6]   grid x y z, block x y z (kind 6; else -1)
 *   texts   list of bytes        each distinct text: a string's content without its quotes,
 *                                a raw value's text as msgspec.Raw keeps it
 *   seen    bytes, uint8[NF]     per field: bit k set when some event's kind is k
 *   end     the offset just after the array's closing bracket. With tail, the text may go on
 *           after it (the trailer of a trace object: the caller decodes it); else only
 *           whitespace may follow.
 * Numbers: an integer as int64; a float correctly rounded (exact fast path, else strtod).
 * The GIL is released while scanning (the read-ahead thread gunzips meanwhile).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_DEPTH 64

enum { K_ABSENT = 0, K_NULL, K_INT, K_FLOAT, K_STR, K_RAW, K_LIST3, K_OBJECT };

/* field classes: what a field accepts */
enum { C_STR, C_NUM, C_RAW, C_DIMS, C_NULLONLY, C_ARGS };

typedef struct {
    const char *key;
    int cls;
} FieldDef;

/* Event fields then Args fields (events.py Event / Args, by their JSON keys). */
static const FieldDef EVENT_FIELDS[] = {
    {"ph", C_STR}, {"cat", C_STR}, {"name", C_STR}, {"pid", C_NUM}, {"tid", C_NUM}, {"ts", C_NUM},
    {"dur", C_NUM}, {"args", C_ARGS},
};
#define N_EVENT_FIELDS 8
static const FieldDef ARGS_FIELDS[] = {
    {"device", C_NUM}, {"stream", C_NUM}, {"correlation", C_NUM}, {"External id", C_NUM},
    {"external id", C_NUM}, {"registers per thread", C_NUM}, {"shared memory", C_NUM},
    {"blocks per SM", C_NUM}, {"warps per SM", C_NUM}, {"est. achieved occupancy %", C_NUM},
    {"bytes", C_NUM}, {"size", C_NUM}, {"Device Type", C_NUM}, {"Device Id", C_NUM}, {"Bytes", C_NUM},
    {"Total Allocated", C_NUM}, {"Total Reserved", C_NUM}, {"Addr", C_NUM}, {"In msg nelems", C_NUM},
    {"Out msg nelems", C_NUM}, {"Group size", C_NUM}, {"Process Group Name", C_NUM}, {"Seq", C_NUM},
    {"Sequence number", C_NUM},
    {"dtype", C_STR}, {"Collective name", C_STR}, {"kernel_file", C_STR}, {"kernel_hash", C_STR},
    {"kernel_backend", C_STR},
    {"Process Group Ranks", C_RAW}, {"Input Dims", C_RAW}, {"Input dims", C_RAW}, {"Input type", C_RAW},
    {"Concrete Inputs", C_RAW}, {"Call stack", C_RAW},
    {"grid", C_DIMS}, {"block", C_DIMS}, {"occupancy", C_NULLONLY},
};
#define N_ARGS_FIELDS 38
#define NF (N_EVENT_FIELDS + N_ARGS_FIELDS)
#define F_ARGS 7
#define F_GRID (N_EVENT_FIELDS + 35)
#define F_BLOCK (N_EVENT_FIELDS + 36)

static size_t event_key_len[N_EVENT_FIELDS];
static size_t args_key_len[N_ARGS_FIELDS];
/* per key length (< MAX_KEY_LEN): the fields with a key that long, -1 ended */
#define MAX_KEY_LEN 32
static signed char event_by_len[MAX_KEY_LEN][N_EVENT_FIELDS + 1];
static signed char args_by_len[MAX_KEY_LEN][N_ARGS_FIELDS + 1];

typedef unsigned char uchar;

typedef struct {
    const uchar *base, *p, *end;
    /* per-event outputs, field-major: field f of event i at f * cap + i */
    size_t n, cap;
    uint8_t *kinds;
    int64_t *dims;
    /* per field: the values of the events where it is there (most fields are absent from most
     * events: a dense array would be mostly zeros) */
    int64_t *values[64]; /* (sparse: converted to one value per event on return) */
    size_t nvalues[64], capvalues[64];
    /* per field: its last text (a repeat, e.g. the previous op's call stack, is not hashed) */
    const uchar *last_text[64];
    size_t last_len[64];
    int64_t last_id[64];
    /* distinct texts */
    size_t nspans, spancap;
    int64_t *spans;
    uint64_t *hashes;
    /* open-addressing table of span ids + 1 (0: empty) */
    uint32_t *table;
    size_t tablecap;
    int oom;
    int tail;        /* text may follow the array */
    const uchar *after; /* just after the array's closing bracket */
} Scan;

/* ------------------------------------------------------------------ texts */

static uint64_t hash_bytes(const uchar *p, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    h ^= h >> 32;
    return h;
}

static int grow_table(Scan *s) {
    size_t cap = s->tablecap ? s->tablecap * 2 : 1024;
    uint32_t *t = calloc(cap, sizeof(uint32_t));
    if (!t) return -1;
    for (size_t i = 0; i < s->nspans; i++) {
        size_t j = (size_t)s->hashes[i] & (cap - 1);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = (uint32_t)(i + 1);
    }
    free(s->table);
    s->table = t;
    s->tablecap = cap;
    return 0;
}

static int64_t text_id(Scan *s, const uchar *p, size_t n);

/* text_id of field f's value: the field's previous text compared first. */
static int64_t field_text_id(Scan *s, int f, const uchar *p, size_t n) {
    if (s->last_text[f] && s->last_len[f] == n && memcmp(s->last_text[f], p, n) == 0) return s->last_id[f];
    int64_t id = text_id(s, p, n);
    s->last_text[f] = p;
    s->last_len[f] = n;
    s->last_id[f] = id;
    return id;
}

/* The id of the text p[0:n) (a new one if not seen), or -1 when out of memory. */
static int64_t text_id(Scan *s, const uchar *p, size_t n) {
    if ((s->nspans + 1) * 2 > s->tablecap && grow_table(s) < 0) return -1;
    uint64_t h = hash_bytes(p, n);
    size_t mask = s->tablecap - 1, j = (size_t)h & mask;
    for (;;) {
        uint32_t e = s->table[j];
        if (!e) break;
        size_t i = e - 1;
        if (s->hashes[i] == h && (size_t)s->spans[2 * i + 1] == n &&
            memcmp(s->base + s->spans[2 * i], p, n) == 0)
            return (int64_t)i;
        j = (j + 1) & mask;
    }
    if (s->nspans == s->spancap) {
        size_t cap = s->spancap ? s->spancap * 2 : 256;
        int64_t *sp = realloc(s->spans, cap * 2 * sizeof(int64_t));
        if (!sp) return -1;
        s->spans = sp;
        uint64_t *hs = realloc(s->hashes, cap * sizeof(uint64_t));
        if (!hs) return -1;
        s->hashes = hs;
        s->spancap = cap;
    }
    size_t i = s->nspans++;
    s->spans[2 * i] = (int64_t)(p - s->base);
    s->spans[2 * i + 1] = (int64_t)n;
    s->hashes[i] = h;
    s->table[j] = (uint32_t)(i + 1);
    return (int64_t)i;
}

/* ------------------------------------------------------------------ lexing */

static inline void skip_ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static inline int hexval(uchar c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string at s->p (at its opening quote): its content in start and len. Valid UTF-8 only, no control
 * characters; escapes only when allow_escapes (then well-formed, no surrogate \u). 0 ok. */
static int lex_string(Scan *s, const uchar **start, size_t *len, int allow_escapes) {
    const uchar *p = s->p + 1, *end = s->end;
    const uchar *begin = p;
    for (;;) {
#ifdef __SSE2__
        /* 16 bytes at a time to the next quote, backslash, control or non-ASCII byte */
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            /* signed: bytes >= 0x80 are negative, so "< 0x20" finds them too */
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                       _mm_cmplt_epi8(v, space));
            int mask = _mm_movemask_epi8(hit);
            if (mask) {
                p += __builtin_ctz((unsigned)mask);
                break;
            }
            p += 16;
        }
#endif
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p >= end) return -1;
        uchar c = *p;
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (!allow_escapes || p + 1 >= end) return -1;
            uchar e = p[1];
            if (e == 'u') {
                if (p + 6 > end) return -1;
                int v = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(p[k]);
                    if (h < 0) return -1;
                    v = v * 16 + h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return -1;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                       e == 't') {
                p += 2;
            } else {
                return -1;
            }
            continue;
        }
        /* UTF-8 sequence (c >= 0x80) */
        if (c >= 0xC2 && c <= 0xDF) {
            if (p + 2 > end || (p[1] & 0xC0) != 0x80) return -1;
            p += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (p + 3 > end || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return -1;
            if (c == 0xE0 && p[1] < 0xA0) return -1;  /* overlong */
            if (c == 0xED && p[1] > 0x9F) return -1;  /* surrogate */
            p += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (p + 4 > end || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return -1;
            if (c == 0xF0 && p[1] < 0x90) return -1;  /* overlong */
            if (c == 0xF4 && p[1] > 0x8F) return -1;  /* beyond U+10FFFF */
            p += 4;
        } else {
            return -1;
        }
    }
    *start = begin;
    *len = (size_t)(p - begin);
    s->p = p + 1;
    return 0;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number at s->p (strict JSON grammar): K_INT (int64) or K_FLOAT (correctly rounded,
 * finite, no underflow). 0 ok. */
static int lex_number(Scan *s, int *kind, int64_t *out) {
    const uchar *p = s->p, *end = s->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end) return -1;
    uint64_t mant = 0;
    int digits = 0;      /* significant digits in mant */
    int dropped = 0;     /* significant digits beyond 19 (not in mant) */
    int frac_digits = 0; /* of those in mant, after the point */
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                dropped++;
            }
            p++;
        }
    } else {
        return -1;
    }
    int is_float = 0;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits == 0 && *p == '0') {
                frac_digits++; /* leading zeros: scale only */
            } else if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
                frac_digits++;
            } else {
                dropped++; /* beyond 19 digits: strtod below */
            }
            p++;
        }
        is_float = 1;
    }
    long exp10 = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp10 < 100000) exp10 = exp10 * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp10 = -exp10;
        is_float = 1;
    }
    s->p = p;
    if (!is_float) {
        if (dropped) return -1;
        /* up to 19 digits: check the int64 range */
        if (digits == 19) {
            /* recompute exactly with overflow checks */
            uint64_t acc = 0;
            const uchar *q = start + neg;
            for (; q < p; q++) {
                uint64_t d = (uint64_t)(*q - '0');
                if (acc > (UINT64_MAX - d) / 10) return -1;
                acc = acc * 10 + d;
            }
            mant = acc;
        }
        if (neg) {
            if (mant > (uint64_t)INT64_MAX + 1) return -1;
            *out = mant == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mant;
        } else {
            if (mant > (uint64_t)INT64_MAX) return -1;
            *out = (int64_t)mant;
        }
        *kind = K_INT;
        return 0;
    }
    double d;
    long e = exp10 - frac_digits + dropped;
    if (!dropped && mant <= (1ULL << 53) && e >= -22 && e <= 22) {
        /* exact operands, one correctly rounded operation */
        d = (double)mant;
        if (e < 0)
            d /= POW10[-e];
        else
            d *= POW10[e];
    } else if (mant == 0 && !dropped) {
        d = 0.0;
    } else {
        char buf[128];
        size_t n = (size_t)(p - start);
        if (n >= sizeof(buf)) return -1;
        memcpy(buf, start, n);
        buf[n] = 0;
        char *stop;
        errno = 0;
        d = strtod(buf, &stop);
        if (stop != buf + n || errno == ERANGE) return -1;
        if (!(d - d == 0.0)) return -1; /* not finite */
        if (d == 0.0) return -1;        /* a nonzero mantissa rounded to 0: underflow */
        neg = 0;                         /* strtod read the sign */
    }
    if (neg) d = -d;
    memcpy(out, &d, sizeof(d));
    *kind = K_FLOAT;
    return 0;
}

static int skip_value(Scan *s, int depth);

static int lex_literal(Scan *s, const char *lit, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return -1;
    s->p += n;
    return 0;
}

/* Any JSON value (validated, not kept). */
static int skip_value(Scan *s, int depth) {
    if (depth > MAX_DEPTH || s->p >= s->end) return -1;
    uchar c = *s->p;
    const uchar *a;
    size_t n;
    int kind;
    int64_t v;
    switch (c) {
    case '"':
        return lex_string(s, &a, &n, 1);
    case '{':
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 0;
        }
        for (;;) {
            if (s->p >= s->end || *s->p != '"' || lex_string(s, &a, &n, 1) < 0) return -1;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return -1;
            s->p++;
            skip_ws(s);
            if (skip_value(s, depth + 1) < 0) return -1;
            skip_ws(s);
            if (s->p >= s->end) return -1;
            if (*s->p == ',') {
                s->p++;
                skip_ws(s);
                continue;
            }
            if (*s->p == '}') {
                s->p++;
                return 0;
            }
            return -1;
        }
    case '[':
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return 0;
        }
        for (;;) {
            if (skip_value(s, depth + 1) < 0) return -1;
            skip_ws(s);
            if (s->p >= s->end) return -1;
            if (*s->p == ',') {
                s->p++;
                skip_ws(s);
                continue;
            }
            if (*s->p == ']') {
                s->p++;
                return 0;
            }
            return -1;
        }
    case 't':
        return lex_literal(s, "true", 4);
    case 'f':
        return lex_literal(s, "false", 5);
    case 'n':
        return lex_literal(s, "null", 4);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return lex_number(s, &kind, &v);
        return -1;
    }
}

/* The slot of field f's value in the current event (0 until written); NULL: out of memory. */
static int64_t *next_value(Scan *s, int f) {
    if (s->nvalues[f] == s->capvalues[f]) {
        size_t cap = s->capvalues[f] ? s->capvalues[f] * 2 : 1024;
        int64_t *v = realloc(s->values[f], cap * sizeof(int64_t));
        if (!v) {
            s->oom = 1;
            return NULL;
        }
        s->values[f] = v;
        s->capvalues[f] = cap;
    }
    int64_t *slot = s->values[f] + s->nvalues[f]++;
    *slot = 0;
    return slot;
}

/* A value of class cls into field f of the current event. */
static int read_field(Scan *s, int f, int cls, int depth) {
    size_t at = (size_t)f * s->cap + s->n;
    uchar c = *s->p;
    int64_t *value = next_value(s, f);
    if (!value) return -1;
    if (c == 'n' && cls != C_RAW) {  /* a raw field keeps null as its text, as msgspec.Raw does */
        if (lex_literal(s, "null", 4) < 0) return -1;
        s->kinds[at] = K_NULL;
        return 0;
    }
    const uchar *a;
    size_t n;
    int64_t id;
    switch (cls) {
    case C_STR:
    case C_NUM:
        if (c == '"') {
            if (lex_string(s, &a, &n, 0) < 0) return -1;
            if ((id = field_text_id(s, f, a, n)) < 0) {
                s->oom = 1;
                return -1;
            }
            s->kinds[at] = K_STR;
            *value = id;
            return 0;
        }
        if (cls == C_NUM && (c == '-' || (c >= '0' && c <= '9'))) {
            int kind;
            if (lex_number(s, &kind, value) < 0) return -1;
            s->kinds[at] = (uint8_t)kind;
            return 0;
        }
        return -1;
    case C_RAW: {
        const uchar *from = s->p;
        if (skip_value(s, depth) < 0) return -1;
        if ((id = field_text_id(s, f, from, (size_t)(s->p - from))) < 0) {
            s->oom = 1;
            return -1;
        }
        s->kinds[at] = K_RAW;
        *value = id;
        return 0;
    }
    case C_DIMS: {
        if (c != '[') return -1;
        s->p++;
        int64_t *out = s->dims + s->n * 6 + (f == F_GRID ? 0 : 3);
        for (int k = 0; k < 3; k++) {
            skip_ws(s);
            int kind;
            if (s->p >= s->end || lex_number(s, &kind, &out[k]) < 0 || kind != K_INT || out[k] < -1) return -1;
            skip_ws(s);
            if (s->p >= s->end || *s->p != (k < 2 ? ',' : ']')) return -1;
            s->p++;
        }
        s->kinds[at] = K_LIST3;
        return 0;
    }
    default:
        return -1;
    }
}

/* The field whose key is a[0:n), among the candidates of that length (-1 ended); -1: none. */
static int match_key(const uchar *a, size_t n, const FieldDef *defs, const signed char *candidates) {
    for (; *candidates >= 0; candidates++)
        if (defs[*candidates].key[0] == (char)a[0] && memcmp(defs[*candidates].key, a, n) == 0) return *candidates;
    return -1;
}

/* An object of known fields (event or args) at s->p ('{'). */
static int read_object(Scan *s, int is_args, int depth) {
    const FieldDef *defs = is_args ? ARGS_FIELDS : EVENT_FIELDS;
    int offset = is_args ? N_EVENT_FIELDS : 0;
    uint64_t seen = 0;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        const uchar *a;
        size_t n;
        if (s->p >= s->end || *s->p != '"' || lex_string(s, &a, &n, 0) < 0) return -1;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return -1;
        s->p++;
        skip_ws(s);
        if (s->p >= s->end) return -1;
        int i = n == 0 || n >= MAX_KEY_LEN ? -1
                : match_key(a, n, defs, is_args ? args_by_len[n] : event_by_len[n]);
        if (i < 0) {
            if (skip_value(s, depth + 1) < 0) return -1;
        } else {
            if (seen & (1ULL << i)) return -1; /* a key twice */
            seen |= 1ULL << i;
            int f = offset + i;
            if (defs[i].cls == C_ARGS) {
                if (*s->p == '{') {
                    s->kinds[(size_t)f * s->cap + s->n] = K_OBJECT;
                    if (!next_value(s, f)) return -1;
                    if (read_object(s, 1, depth + 1) < 0) return -1;
                } else if (read_field(s, f, C_NULLONLY, depth + 1) < 0) {
                    return -1;
                }
            } else if (read_field(s, f, defs[i].cls, depth + 1) < 0) {
                return -1;
            }
        }
        skip_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') {
            s->p++;
            skip_ws(s);
            continue;
        }
        if (*s->p == '}') {
            s->p++;
            return 0;
        }
        return -1;
    }
}

/* New field-major arrays (zeroed: absent) with the n events so far copied over. */
static int grow_events(Scan *s) {
    size_t cap = s->cap ? s->cap * 2 : 4096;
    uint8_t *k = calloc(cap * NF, 1);
    int64_t *d = realloc(s->dims, cap * 6 * sizeof(int64_t));
    if (!k || !d) {
        free(k);
        if (d) s->dims = d;
        return -1;
    }
    for (size_t f = 0; f < NF && s->n; f++) memcpy(k + f * cap, s->kinds + f * s->cap, s->n);
    memset(d + s->cap * 6, 0xff, (cap - s->cap) * 6 * sizeof(int64_t)); /* -1 */
    free(s->kinds);
    s->kinds = k;
    s->dims = d;
    s->cap = cap;
    return 0;
}

/* The whole chunk: 0 handled, -1 not handled (or out of memory: s->oom). */
static int scan_chunk(Scan *s) {
    skip_ws(s);
    if (s->p >= s->end || *s->p != '[') return -1;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
    } else {
        for (;;) {
            if (s->p >= s->end || *s->p != '{') return -1;
            if (s->n == s->cap && grow_events(s) < 0) {
                s->oom = 1;
                return -1;
            }
            if (read_object(s, 0, 1) < 0) return -1;
            s->n++;
            skip_ws(s);
            if (s->p >= s->end) return -1;
            if (*s->p == ',') {
                s->p++;
                skip_ws(s);
                continue;
            }
            if (*s->p == ']') {
                s->p++;
                break;
            }
            return -1;
        }
    }
    s->after = s->p;
    if (s->tail) return 0;
    skip_ws(s);
    return s->p == s->end ? 0 : -1;
}

static void scan_free(Scan *s) {
    free(s->kinds);
    for (int f = 0; f < NF; f++) free(s->values[f]);
    free(s->dims);
    free(s->spans);
    free(s->hashes);
    free(s->table);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    int tail = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &tail)) return NULL;
    Scan s;
    memset(&s, 0, sizeof(s));
    s.tail = tail;
    s.base = s.p = (const uchar *)view.buf;
    s.end = s.base + view.len;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan_chunk(&s);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc < 0) {
        int oom = s.oom;
        scan_free(&s);
        if (oom) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    PyObject *out = NULL, *texts = NULL;
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(s.n * NF));
    PyObject *values = PyList_New(NF);
    PyObject *dims = PyBytes_FromStringAndSize(s.n ? (const char *)s.dims : "", (Py_ssize_t)(s.n * 6 * sizeof(int64_t)));
    PyObject *seen = PyBytes_FromStringAndSize(NULL, NF);
    if (!kinds || !values || !dims || !seen) goto done;
    for (size_t f = 0; f < NF && s.n; f++)  /* the fields' first n kinds, one after the other */
        memcpy(PyBytes_AS_STRING(kinds) + f * s.n, s.kinds + f * s.cap, s.n);
    for (int f = 0; f < NF; f++) {
        /* one value per event: the field's values where it is there, -1 where absent or null */
        const uint8_t *k = s.kinds + (size_t)f * s.cap;
        const int64_t *sparse = s.values[f];
        uint8_t kinds_seen = s.n > s.nvalues[f] ? 1 << K_ABSENT : 0;
        PyObject *v = PyBytes_FromStringAndSize(NULL, s.nvalues[f] ? (Py_ssize_t)(s.n * sizeof(int64_t)) : 0);
        if (!v) goto done;
        PyList_SET_ITEM(values, f, v);
        if (s.nvalues[f]) {
            int64_t *dense = (int64_t *)PyBytes_AS_STRING(v);
            for (size_t i = 0; i < s.n; i++) {
                uint8_t kind = k[i];
                kinds_seen |= (uint8_t)(1 << kind);
                if (kind == K_ABSENT) {
                    dense[i] = -1;
                } else {
                    int64_t x = *sparse++;
                    dense[i] = kind == K_NULL ? -1 : x;
                }
            }
        }
        PyBytes_AS_STRING(seen)[f] = (char)kinds_seen;
    }
    texts = PyList_New((Py_ssize_t)s.nspans);
    if (!texts) goto done;
    for (size_t i = 0; i < s.nspans; i++) {
        PyObject *t = PyBytes_FromStringAndSize((const char *)s.base + s.spans[2 * i], (Py_ssize_t)s.spans[2 * i + 1]);
        if (!t) goto done;
        PyList_SET_ITEM(texts, (Py_ssize_t)i, t);
    }
    out = Py_BuildValue("(nOOOOOn)", (Py_ssize_t)s.n, kinds, values, dims, texts, seen,
                        (Py_ssize_t)(s.after - s.base));
done:
    Py_XDECREF(seen);
    Py_XDECREF(kinds);
    Py_XDECREF(values);
    Py_XDECREF(dims);
    Py_XDECREF(texts);
    scan_free(&s);
    return out;
}

/* first_seen(ids, size): the distinct ids >= 0 of ids (int64, contiguous; each < size) in
 * the order they first occur, as int64 bytes. */
static PyObject *first_seen(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*n", &view, &size)) return NULL;
    if (view.len % (Py_ssize_t)sizeof(int64_t) || size < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "first_seen: int64 ids and a size >= 0");
        return NULL;
    }
    const int64_t *ids = (const int64_t *)view.buf;
    Py_ssize_t n = view.len / (Py_ssize_t)sizeof(int64_t);
    uint8_t *seen = calloc((size_t)size + 1, 1);
    int64_t *order = malloc(((size_t)(n < size ? n : size) + 1) * sizeof(int64_t));
    if (!seen || !order) {
        free(seen);
        free(order);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_ssize_t m = 0;
    int bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (id < 0) continue;
        if (id >= size) {
            bad = 1;
            break;
        }
        if (!seen[id]) {
            seen[id] = 1;
            order[m++] = id;
        }
    }
    PyBuffer_Release(&view);
    PyObject *out = bad ? NULL : PyBytes_FromStringAndSize((const char *)order, m * (Py_ssize_t)sizeof(int64_t));
    if (bad) PyErr_SetString(PyExc_ValueError, "first_seen: an id beyond size");
    free(seen);
    free(order);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(chunk, tail=False) -> (n, kinds, values, dims, texts, seen, end) or None when the chunk is not the "
     "clean case."},
    {"first_seen", first_seen, METH_VARARGS, "first_seen(int64 ids, size) -> int64 bytes: distinct ids >= 0 in order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastscan(void) {
    memset(event_by_len, -1, sizeof(event_by_len));
    memset(args_by_len, -1, sizeof(args_by_len));
    for (int i = 0; i < N_EVENT_FIELDS; i++) {
        size_t n = event_key_len[i] = strlen(EVENT_FIELDS[i].key);
        int k = 0;
        while (event_by_len[n][k] >= 0) k++;
        event_by_len[n][k] = (signed char)i;
    }
    for (int i = 0; i < N_ARGS_FIELDS; i++) {
        size_t n = args_key_len[i] = strlen(ARGS_FIELDS[i].key);
        int k = 0;
        while (args_by_len[n][k] >= 0) k++;
        args_by_len[n][k] = (signed char)i;
    }
    PyObject *m = PyModule_Create(&module);
    /* native.py uses the module only when both match what it reads (a stale build is not used) */
    if (m && (PyModule_AddIntConstant(m, "NF", NF) < 0 || PyModule_AddIntConstant(m, "LAYOUT", 4) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
