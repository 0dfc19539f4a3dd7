/* json_locate.h — find where a key sits in JSON text.
 *
 * jansson keeps no source positions in the values it builds, so semantic errors
 * (unknown key, wrong type, bad value) find theirs here: a small scanner over
 * JSON text that jansson has already accepted, tracking line, column and the
 * key path. Lines and columns are 1-based and count UTF-8 characters, as
 * jansson's own syntax errors do.
 */
#ifndef FSO_JSON_LOCATE_H
#define FSO_JSON_LOCATE_H

/* Position of path[0..depth) in the NUL-terminated JSON `text`.
 *
 * Inside an object a path element is a key; inside an array it is an index,
 * written "1" or "[1]". For an object member the position is that of the key's
 * opening quote; for an array element, that of the element's first character.
 * depth 0 names the whole document (the position of its first token).
 * Returns 0 and sets *line, *col; -ENOENT when the path is not in the text;
 * -EINVAL when the text is not JSON (or nests deeper than 4096 levels). */
int fso_json_locate(const char *text, const char *const *path, int depth, int *line, int *col);

#endif
