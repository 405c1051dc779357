/* pickle: a restricted pickle reader and a small pickle writer.
 *
 * DCP `.metadata` files (protocol 4) and torch.save `data.pkl` records
 * (protocol 2) are pickles (docs/FORMATS.md, "torch_dist" and "torch.save").  reshardfs must read them
 * without Python and write new ones for its views.
 *
 * Reader.  rs_pickle_parse() runs the pickle machine over a buffer and
 * builds INERT values.  Nothing is executed, imported or resolved:
 *   - GLOBAL / STACK_GLOBAL give a GLOBAL value (module, name).  It must
 *     match one of the caller's allowlist patterns, or the parse fails with
 *     a line naming it.
 *   - REDUCE(callable, args) gives a REDUCE value.
 *   - NEWOBJ(cls, args) and NEWOBJ_EX(cls, args, kwargs) give an OBJECT.
 *   - BUILD(state) records the state on the REDUCE or OBJECT below it.
 *   - APPEND(S) / SETITEM(S) on a REDUCE or OBJECT (an OrderedDict is
 *     REDUCE(collections.OrderedDict, ()) + SETITEMS) are recorded as its
 *     list items / dict items.
 *   - BINPERSID / PERSID give a PERSID value holding the pid.
 * Opcodes: those of protocols 1-5 (see pickle.c), less INST and OBJ
 * (Python 3 never writes them), EXT1/2/4 (codes of copyreg's extension
 * registry, which nothing here registers), protocol 0's text FLOAT, LONG,
 * STRING and UNICODE (torch.save cannot write protocol 0) and protocol 5's
 * NEXT_BUFFER and READONLY_BUFFER, whose out-of-band buffers are never in
 * a file.  BYTEARRAY8 gives what protocols 3-4 write
 * for a bytearray, REDUCE(builtins.bytearray, (bytes,)), builtins.bytearray
 * being checked like any GLOBAL.  Any other opcode fails with its byte and
 * offset.
 *
 * Construction forms.  A few callables are read only in one shape, whatever
 * the allowlist says; their GLOBAL gives a token that only that REDUCE may
 * take, and a token anywhere else (in a list, dict, set, state, persistent
 * id, as the result, NEWOBJ'd, or a tuple holding one used so) fails the
 * parse with a line naming it:
 *   - REDUCE(builtins.getattr, (cls, 'name')), how Python 3.11.0-3.11.4
 *     pickle an Enum member (3.11.5 and later write REDUCE(cls, (value,)))
 *     and protocols below 4 a nested class, gives the GLOBAL (module,
 *     "Cls.name") - what protocol 4 spells STACK_GLOBAL(module, "Cls.name"),
 *     as inert as cls itself.  cls must be an allowed GLOBAL (not itself a
 *     getattr result) and name an ASCII identifier that does not start
 *     with '_' (no __class__, __globals__, __subclasses__); a third
 *     argument (a default) is refused.  Such a GLOBAL is data: REDUCE or
 *     NEWOBJ of it is refused.
 *   - copyreg._reconstructor(cls, object, None), copyreg.__newobj__(cls,
 *     *args) and copyreg.__newobj_ex__(cls, args, kwargs), what protocols 0
 *     and 1 write for objects, give the OBJECT(cls, args[, kwargs]) that
 *     NEWOBJ / NEWOBJ_EX give for the same object; cls must be an allowed
 *     GLOBAL.  builtins.object is a token too (the base there) unless the
 *     allowlist has it.
 *
 * Ownership.  Every value of one parse lives in its rs_pickle and is freed,
 * all at once, by rs_pickle_free().  Values are shared (the memo hands out
 * the same value again) and may form cycles (a list appended to itself), so
 * a consumer that recurses must bound its own depth.  Accessors never
 * allocate; they take NULL or a value of the wrong kind and then return
 * NULL, 0 or -EINVAL, so lookups can be chained:
 *     rs_pv_get(rs_pv_state(root), "storage_data")
 *
 * Errors.  Functions return 0 or a negative errno.  A failed parse also
 * writes one line "offset N: <what>" to err (N is the opcode's offset):
 *   -EINVAL  malformed, truncated, or a GLOBAL not allowed
 *   -E2BIG   a limit in rs_pickle_limits was exceeded
 *   -ENOMEM  out of memory
 *
 * Writer.  rs_pwriter emits pickles into a growable buffer with the opcodes
 * torch's weights_only unpickler accepts (protocol 2), which Python's
 * unpickler accepts under any PROTO header.  No memo, no FRAME.  Calls are
 * void; the first error sticks and rs_pw_finish() returns it.  The writer
 * tracks the stack, so unbalanced use (a BUILD with nothing below, a dict
 * with an odd item count, a finish with != 1 value) is an error, not a
 * broken pickle.
 */
#ifndef RS_PICKLE_H
#define RS_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- reader ---------------------------------------------------------- */

typedef enum rs_pkind {
	RS_PV_NONE = 1,
	RS_PV_BOOL,
	RS_PV_INT,	/* fits int64_t */
	RS_PV_BIGINT,	/* LONG1/LONG4 wider than 8 bytes: little-endian
			 * two's complement bytes, as stored */
	RS_PV_FLOAT,
	RS_PV_STR,	/* BINUNICODE*, and BINSTRING* (py2 str) */
	RS_PV_BYTES,	/* BINBYTES*; protocol 2 writes bytes as
			 * REDUCE(_codecs.encode, (str, 'latin1')) instead */
	RS_PV_TUPLE,
	RS_PV_LIST,
	RS_PV_DICT,	/* ordered key/value pairs, duplicates kept */
	RS_PV_SET,	/* set and frozenset */
	RS_PV_GLOBAL,
	RS_PV_REDUCE,
	RS_PV_OBJECT,
	RS_PV_PERSID,
} rs_pkind;

typedef struct rs_pickle rs_pickle;
typedef struct rs_pvalue rs_pvalue;

/* Bounds on what a parse may cost.  All sizes are checked before use. */
typedef struct rs_pickle_limits {
	uint64_t max_input;	/* bytes of pickle */
	uint64_t max_ops;	/* opcodes executed */
	uint64_t max_alloc;	/* bytes allocated for values, in all */
	uint32_t max_stack;	/* values on the stack */
	uint32_t max_depth;	/* open MARKs (nesting of containers being
				 * built) */
	uint32_t max_memo;	/* distinct memo entries */
	uint64_t max_items;	/* items of one container */
	uint64_t max_str;	/* bytes of one str or bytes */
	uint32_t max_long;	/* bytes of one LONG1/LONG4 */
	/* NULL-terminated "module.name" patterns; a trailing '*' matches any
	 * rest ("torch.*").  NULL allows no GLOBAL at all. */
	const char *const *allow;
	/* A torch.save data.pkl: persistent ids must be tuples, as
	 * torch.load's persistent_load reads them (it raises on a text PERSID
	 * or any other value).  rs_pickle_limits_torch sets it. */
	bool torch_persids;
} rs_pickle_limits;

/* 256 MiB input, 64 Mi opcodes, 1 GiB of values, 1 Mi stack, depth 1000
 * (Python's own pickler recursion limit), 16 Mi memo entries and container
 * items, 256 MiB strings, 256-byte longs; allow = NULL. */
void rs_pickle_limits_default(rs_pickle_limits *lim);

/* The globals DCP .metadata and torch.save data.pkl use: torch.*,
 * collections.OrderedDict, pathlib.* (StorageMeta.checkpoint_id),
 * megatron.core.dist_checkpointing.* (MCoreMetadata), _codecs.encode and
 * builtins.set/frozenset/bytearray. */
extern const char *const rs_pickle_allow_torch[];

/* Parses buf[0, len) up to its STOP (later bytes are ignored, as Python
 * does).  lim NULL means the defaults, which allow no GLOBAL.  On success
 * *out owns every value; rs_pickle_root() is the unpickled object. */
int rs_pickle_parse(const uint8_t *buf, size_t len,
		    const rs_pickle_limits *lim, rs_pickle **out, char *err,
		    size_t errlen);
void rs_pickle_free(rs_pickle *p);
const rs_pvalue *rs_pickle_root(const rs_pickle *p);

/* True when the pattern list allows module.name (exposed for tests). */
bool rs_pickle_allowed(const char *const *allow, const char *module,
		       const char *name);

/* 0 for NULL. */
rs_pkind rs_pv_kind(const rs_pvalue *v);

int rs_pv_bool(const rs_pvalue *v, bool *out);
/* INT only (a BOOL is not an int here). */
int rs_pv_int(const rs_pvalue *v, int64_t *out);
/* INT values are converted, so 1 reads as 1.0. */
int rs_pv_float(const rs_pvalue *v, double *out);
/* STR: NUL-terminated (it may also hold NULs; *len is exact). */
const char *rs_pv_str(const rs_pvalue *v, size_t *len);
/* BYTES and BIGINT. */
const uint8_t *rs_pv_bytes(const rs_pvalue *v, size_t *len);
/* STR equal to s. */
bool rs_pv_str_is(const rs_pvalue *v, const char *s);

/* A value as refusals show it, into buf (returned): "missing" for NULL,
 * None, 3, an int wider than 64 bits, 0.5 (a float), True (a bool),
 * '...' (a str, its first 40 bytes), or "a value of another type".
 * Floats are written shortest that reads back the same. */
const char *rs_pv_text(const rs_pvalue *v, char *buf, size_t size);

/* TUPLE, LIST, SET: item count and item i; DICT: pair count. */
size_t rs_pv_len(const rs_pvalue *v);
const rs_pvalue *rs_pv_item(const rs_pvalue *v, size_t i);
const rs_pvalue *rs_pv_key(const rs_pvalue *dict, size_t i);
const rs_pvalue *rs_pv_val(const rs_pvalue *dict, size_t i);
/* DICT lookup by STR key; the last pair wins, as in Python.  A linear
 * scan: walk big dicts with rs_pv_key/rs_pv_val instead. */
const rs_pvalue *rs_pv_get(const rs_pvalue *dict, const char *key);

/* GLOBAL. */
const char *rs_pv_global_module(const rs_pvalue *v);
const char *rs_pv_global_name(const rs_pvalue *v);
/* GLOBAL made by getattr(cls, attr): attr (the part of the name after
 * cls's); NULL for any other value, GLOBALs from GLOBAL/STACK_GLOBAL
 * included. */
const char *rs_pv_global_attr(const rs_pvalue *v);
/* GLOBAL whose "module.name" equals full, e.g. "torch._utils._rebuild_tensor_v2". */
bool rs_pv_global_is(const rs_pvalue *v, const char *full);

/* REDUCE and OBJECT: the callable (REDUCE) or class (OBJECT), the args
 * tuple, NEWOBJ_EX's kwargs dict, the BUILD state (a dict, or a
 * (dict, slotstate) tuple, or whatever __setstate__ takes), and the items
 * APPEND(S) and SETITEM(S) added (a LIST and a DICT).  NULL when absent. */
const rs_pvalue *rs_pv_func(const rs_pvalue *v);
const rs_pvalue *rs_pv_args(const rs_pvalue *v);
const rs_pvalue *rs_pv_kwargs(const rs_pvalue *v);
const rs_pvalue *rs_pv_state(const rs_pvalue *v);
const rs_pvalue *rs_pv_listitems(const rs_pvalue *v);
const rs_pvalue *rs_pv_dictitems(const rs_pvalue *v);
/* A dict, or an OrderedDict (REDUCE(collections.OrderedDict, ()) and its
 * SETITEMS): *pairs its pairs, NULL for an empty OrderedDict (rs_pv_len
 * 0).  False for any other value. */
bool rs_pv_dict_like(const rs_pvalue *v, const rs_pvalue **pairs);

/* REDUCE or OBJECT whose callable/class is the GLOBAL `full`. */
bool rs_pv_call_is(const rs_pvalue *v, const char *full);

/* A non-negative int as uint64_t; false for anything else. */
bool rs_pv_u64(const rs_pvalue *v, uint64_t *out);
/* torch.Size((a, b, ...)) or a plain tuple/list of at most `max`
 * non-negative ints: *n of them into out.  False for anything else. */
bool rs_pv_dims(const rs_pvalue *v, uint64_t *out, int *n, int max);

/* PERSID: the pid (BINPERSID: usually a tuple; PERSID: a STR). */
const rs_pvalue *rs_pv_persid(const rs_pvalue *v);

/* ---- writer ---------------------------------------------------------- */

typedef struct rs_pwriter {
	uint8_t *buf;
	size_t len, cap;
	size_t depth;		/* values on the stack */
	size_t *marks;		/* open MARKs: depth << 2 | container */
	size_t nmarks, cmarks;
	int proto;
	int err;		/* first error, sticky */
} rs_pwriter;

/* Starts a pickle with PROTO `proto` (2..4). */
void rs_pw_init(rs_pwriter *w, int proto);
/* Frees the buffer unless rs_pw_finish() handed it out. */
void rs_pw_free(rs_pwriter *w);

void rs_pw_none(rs_pwriter *w);
void rs_pw_bool(rs_pwriter *w, bool b);
void rs_pw_int(rs_pwriter *w, int64_t v);
void rs_pw_float(rs_pwriter *w, double v);
void rs_pw_str(rs_pwriter *w, const char *s, size_t len);
void rs_pw_cstr(rs_pwriter *w, const char *s);
/* BINBYTES under protocol >= 3; under 2, what Python writes:
 * _codecs.encode(latin-1 text, 'latin1'). */
void rs_pw_bytes(rs_pwriter *w, const void *p, size_t len);
void rs_pw_global(rs_pwriter *w, const char *module, const char *name);

/* Containers: _begin, push the items (dicts: key, value, key, ...), _end. */
void rs_pw_tuple_begin(rs_pwriter *w);
void rs_pw_tuple_end(rs_pwriter *w);
/* Tuple of the top n (0..3) values, without a MARK. */
void rs_pw_tuple_n(rs_pwriter *w, int n);
void rs_pw_list_begin(rs_pwriter *w);
void rs_pw_list_end(rs_pwriter *w);
void rs_pw_dict_begin(rs_pwriter *w);
void rs_pw_dict_end(rs_pwriter *w);

/* Items added to the object on top (a REDUCE or NEWOBJ result: an
 * OrderedDict, a list subclass): _begin pushes a MARK above it, then push
 * the items (dicts: key, value, ...), then rs_pw_list_end (APPENDS) or
 * rs_pw_dict_end (SETITEMS), which leave the object on top. */
void rs_pw_appends_begin(rs_pwriter *w);
void rs_pw_setitems_begin(rs_pwriter *w);

/* An integer of any width: `len` bytes of little-endian two's
 * complement, as LONG1 (len < 256) or LONG4. */
void rs_pw_bigint(rs_pwriter *w, const uint8_t *le, size_t len);

/* callable args -> REDUCE; cls args -> NEWOBJ; obj state -> BUILD (obj
 * stays); pid -> BINPERSID. */
void rs_pw_reduce(rs_pwriter *w);
void rs_pw_newobj(rs_pwriter *w);
void rs_pw_build(rs_pwriter *w);
void rs_pw_persid(rs_pwriter *w);

/* ---- copying parsed values into a writer ----------------------------- */

/* Limits of one rs_pw_value call.  A parsed value may share sub-values
 * (the memo) and even contain itself, while the writer keeps no memo:
 * every reference is written out again, so both the nesting and the
 * number of values written are bounded. */
#define RS_PW_COPY_MAX_DEPTH 100
#define RS_PW_COPY_MAX_VALUES (1u << 20)

/* The value of an Enum member, so that a getattr(cls, name) GLOBAL can be
 * written as REDUCE(cls, (value,)) - the form Python 3.11.5+ write and the
 * only one torch's weights_only unpickler loads (it allows no getattr). */
typedef struct rs_pw_member {
	const char *cls;	/* "module.Class" */
	const char *name;
	int64_t value;
} rs_pw_member;

/* Writes `v` (from rs_pickle_parse) as a pickle that unpickles to the
 * same object: scalars, strings, bytes, containers, GLOBALs and the
 * REDUCE/NEWOBJ objects built from them, with their APPENDS/SETITEMS
 * items and BUILD state, in the order Python's pickler writes them.  A
 * set is written as builtins.set([...]) (protocol 2 has no set opcode; a
 * frozenset becomes a set).  A getattr(cls, name) GLOBAL is written as
 * REDUCE(cls, (value,)) when `members` (cls NULL ends it; NULL for none)
 * has its value, else as REDUCE(builtins.getattr, (cls, name)) again.
 * Refused with -EINVAL and one line in err: a GLOBAL that `allow`
 * (patterns as rs_pickle_limits.allow) does not allow (a getattr GLOBAL
 * is checked by its whole dotted name, so "pkg.enums.*" allows the
 * members of pkg.enums's classes), a dotted name not from getattr (a
 * protocol 4 qualified name: GLOBAL cannot spell it), a persistent id (a
 * tensor or storage), NEWOBJ_EX keyword arguments, nesting past
 * RS_PW_COPY_MAX_DEPTH or more than RS_PW_COPY_MAX_VALUES values (-E2BIG).
 * Writer errors (-ENOMEM) are returned too. */
int rs_pw_value(rs_pwriter *w, const rs_pvalue *v, const char *const *allow,
		const rs_pw_member *members, char *err, size_t errlen);

/* Appends STOP and hands the buffer to the caller (free() it).  Returns
 * 0, or the first error: -EINVAL for unbalanced use, -ENOMEM, -E2BIG for a
 * string over 4 GiB.  Either way the writer is released (rs_pw_free is
 * then a harmless no-op). */
int rs_pw_finish(rs_pwriter *w, uint8_t **out, size_t *len);

#endif
