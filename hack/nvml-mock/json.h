/*
 * json.h - a small JSON reader/writer for the NVML mock's state file.
 *
 * The state file is tiny and written by our own tools, so a tree parser with
 * no streaming and no Unicode beyond \u00XX is enough.
 */
#ifndef PATCHBAY_JSON_H
#define PATCHBAY_JSON_H

#include <stdio.h>

enum json_type { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct json {
    enum json_type type;
    double num;
    int boolean;
    char *str;            /* J_STR value */
    char *key;            /* member name when inside an object */
    struct json *child;   /* first element / member */
    struct json *next;    /* next sibling */
};

struct json *json_parse(const char *text, char *err, size_t errlen);
void json_free(struct json *v);
struct json *json_get(const struct json *obj, const char *key);
const char *json_str(const struct json *obj, const char *key, const char *dflt);
double json_num(const struct json *obj, const char *key, double dflt);
int json_bool(const struct json *obj, const char *key, int dflt);

void json_write_str(FILE *f, const char *s);

#endif
