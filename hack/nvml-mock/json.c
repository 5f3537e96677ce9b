/*
 * json.c - recursive-descent JSON parser into a linked tree, plus a string
 * writer. Written for the mock's state file; not a general library.
 */
#include "json.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const char *p;
    char *err;
    size_t errlen;
    int depth;
};

static struct json *parse_value(struct parser *ps);

static void fail(struct parser *ps, const char *msg)
{
    if (ps->err && ps->err[0] == '\0')
        snprintf(ps->err, ps->errlen, "%s near '%.16s'", msg, ps->p);
}

static void skip_ws(struct parser *ps)
{
    while (*ps->p && isspace((unsigned char)*ps->p))
        ps->p++;
}

static struct json *node(enum json_type t)
{
    struct json *v = calloc(1, sizeof(*v));
    if (v)
        v->type = t;
    return v;
}

static char *parse_string_raw(struct parser *ps)
{
    if (*ps->p != '"') {
        fail(ps, "expected string");
        return NULL;
    }
    ps->p++;
    size_t cap = 32, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    while (*ps->p && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\') {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned code = 0;
                for (int i = 0; i < 4; i++) {
                    if (!isxdigit((unsigned char)ps->p[i])) {
                        fail(ps, "bad \\u escape");
                        free(out);
                        return NULL;
                    }
                }
                sscanf(ps->p, "%4x", &code);
                ps->p += 4;
                c = code < 0x80 ? (char)code : '?';
                break;
            }
            case '"': case '\\': case '/': c = e; break;
            default:
                fail(ps, "bad escape");
                free(out);
                return NULL;
            }
        }
        if (len + 2 > cap) {
            cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        out[len++] = c;
    }
    if (*ps->p != '"') {
        fail(ps, "unterminated string");
        free(out);
        return NULL;
    }
    ps->p++;
    out[len] = '\0';
    return out;
}

static struct json *parse_container(struct parser *ps, int is_obj)
{
    struct json *v = node(is_obj ? J_OBJ : J_ARR);
    struct json **tail = &v->child;
    char close = is_obj ? '}' : ']';
    ps->p++;
    skip_ws(ps);
    if (*ps->p == close) {
        ps->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (is_obj) {
            key = parse_string_raw(ps);
            if (!key)
                goto bad;
            skip_ws(ps);
            if (*ps->p != ':') {
                free(key);
                fail(ps, "expected ':'");
                goto bad;
            }
            ps->p++;
        }
        struct json *item = parse_value(ps);
        if (!item) {
            free(key);
            goto bad;
        }
        item->key = key;
        *tail = item;
        tail = &item->next;
        skip_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            return v;
        }
        fail(ps, "expected ',' or closing bracket");
        goto bad;
    }
bad:
    json_free(v);
    return NULL;
}

static struct json *parse_value(struct parser *ps)
{
    struct json *v = NULL;
    skip_ws(ps);
    if (++ps->depth > 64) {
        fail(ps, "nesting too deep");
        return NULL;
    }
    char c = *ps->p;
    if (c == '{' || c == '[') {
        v = parse_container(ps, c == '{');
    } else if (c == '"') {
        char *s = parse_string_raw(ps);
        if (s) {
            v = node(J_STR);
            v->str = s;
        }
    } else if (strncmp(ps->p, "true", 4) == 0 || strncmp(ps->p, "false", 5) == 0) {
        v = node(J_BOOL);
        v->boolean = c == 't';
        ps->p += v->boolean ? 4 : 5;
    } else if (strncmp(ps->p, "null", 4) == 0) {
        v = node(J_NULL);
        ps->p += 4;
    } else if (c == '-' || isdigit((unsigned char)c)) {
        char *end;
        double d = strtod(ps->p, &end);
        v = node(J_NUM);
        v->num = d;
        ps->p = end;
    } else {
        fail(ps, "unexpected character");
    }
    ps->depth--;
    return v;
}

struct json *json_parse(const char *text, char *err, size_t errlen)
{
    struct parser ps = {text, err, errlen, 0};
    if (err && errlen)
        err[0] = '\0';
    struct json *v = parse_value(&ps);
    if (!v)
        return NULL;
    skip_ws(&ps);
    if (*ps.p) {
        fail(&ps, "trailing data");
        json_free(v);
        return NULL;
    }
    return v;
}

void json_free(struct json *v)
{
    while (v) {
        struct json *next = v->next;
        json_free(v->child);
        free(v->str);
        free(v->key);
        free(v);
        v = next;
    }
}

struct json *json_get(const struct json *obj, const char *key)
{
    if (!obj || obj->type != J_OBJ)
        return NULL;
    for (struct json *m = obj->child; m; m = m->next)
        if (m->key && strcmp(m->key, key) == 0)
            return m;
    return NULL;
}

const char *json_str(const struct json *obj, const char *key, const char *dflt)
{
    struct json *v = json_get(obj, key);
    return v && v->type == J_STR ? v->str : dflt;
}

double json_num(const struct json *obj, const char *key, double dflt)
{
    struct json *v = json_get(obj, key);
    return v && v->type == J_NUM ? v->num : dflt;
}

int json_bool(const struct json *obj, const char *key, int dflt)
{
    struct json *v = json_get(obj, key);
    return v && v->type == J_BOOL ? v->boolean : dflt;
}

void json_write_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}
