#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_safetensors_header into tests/fuzz/corpus/ (stdlib only).
Valid files follow the reference layout (tensors tile the data section, header padded with
spaces to 8 bytes); broken ones each break one rule the parser checks."""
import json, os, struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
SIZE = {'F32': 4, 'F16': 2, 'BF16': 2, 'F64': 8, 'I64': 8, 'I32': 4, 'I16': 2, 'I8': 1, 'U8': 1, 'BOOL': 1}


def header_bytes(header, pad=True):
    text = json.dumps(header, separators=(',', ':')).encode()
    if pad:
        text += b' ' * ((8 - len(text) % 8) % 8)
    return text


def build(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] -> a valid file with patterned data."""
    header, data = {}, b''
    if metadata is not None:
        header['__metadata__'] = metadata
    for name, dtype, shape in tensors:
        n = SIZE[dtype]
        for d in shape:
            n *= d
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [len(data), len(data) + n]}
        data += bytes((i * 7 + 3) & 0xff for i in range(n))
    h = header_bytes(header)
    return struct.pack('<Q', len(h)) + h + data


def raw(header_text, data=b'', length=None):
    h = header_text.encode() if isinstance(header_text, str) else header_text
    return struct.pack('<Q', len(h) if length is None else length) + h + data


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {
        'valid_single': build([('w', 'F32', [2])]),
        'valid_empty_header': build([]),
        'valid_llama_names': build([('model.embed_tokens.weight', 'F32', [4, 2]),
                                    ('model.layers.0.self_attn.q_proj.weight', 'BF16', [2, 2]),
                                    ('model.norm.weight', 'F32', [2])],
                                   {'format': 'pt', 'model.embed_tokens.weight': 'lm_head.weight'}),
        'valid_all_dtypes': build([(d.lower(), d, [2]) for d in sorted(SIZE, key=lambda d: -SIZE[d])]),
        'valid_scalar_and_empty': build([('s', 'F64', []), ('e', 'F32', [0, 3]), ('x', 'I8', [3])]),
        'valid_unicode_name': build([('gewichte.\u00fc\u4e2d', 'U8', [1])], {'n': '\u00e9'}),
        'broken_short': b'\x05\x00\x00',
        'broken_len_too_big': raw('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b'\0' * 8, 1 << 40),
        'broken_len_huge': raw('{}', b'', (1 << 64) - 1),
        'broken_json': raw('{"w":{"dtype":"F32",,"shape":[2]}}', b'\0' * 8),
        'broken_not_object': raw('[1,2,3]'),
        'broken_overlap': raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                              '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b'\0' * 12),
        'broken_byte_count': raw('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b'\0' * 8),
        'broken_unknown_dtype': raw('{"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}', b'\0' * 2),
        'broken_hole': raw('{"w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b'\0' * 4),
        'broken_trailing': raw('{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b'\0' * 6),
        'broken_truncated_data': build([('w', 'F32', [64])])[:-100],
        'broken_shape_overflow': raw('{"w":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}}'),
        'broken_negative_dim': raw('{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b'\0' * 4),
        'broken_float_offsets': raw('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]}}', b'\0' * 4),
        'broken_metadata_type': raw('{"__metadata__":{"k":1}}'),
        'broken_deep': raw('{"w":' + '[' * 64 + ']' * 64 + '}'),
        'broken_bad_utf8': raw(b'{"w\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b'\0'),
        'broken_big_number': raw('{"w":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}}', b'\0'),
    }
    for name, content in files.items():
        with open(os.path.join(OUT, name), 'wb') as f:
            f.write(content)
    print('wrote %d seed inputs to %s' % (len(files), OUT))


if __name__ == '__main__':
    main()
