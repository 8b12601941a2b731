#!/usr/bin/python3
"""Independent check that the grammar of a bounded number is exact: each input line is
{"schema": {...}, "text": "<a JSON number>", "accepted": bool}, where `accepted` is what the
grammar said. This script decides on its own (Python's decimal module, no shared code) whether
the text is in the bounded-digit language the grammar promises (docs/openai_api.md: integers of
at most 19 digits; numbers with a mantissa of at most 15 significant digits, counting leading
zeros of a fraction but not a lone "0" before the point, and an exponent of at most 2 digits)
and whether its value satisfies the schema's minimum / maximum / exclusiveMinimum /
exclusiveMaximum / multipleOf. The grammar must accept exactly the texts that are in the
language and satisfy the schema. For numbers it also checks that a binary64 reading (what a
validator that parses doubles sees) agrees with the exact decimal decision. Prints a summary;
exit 1 on the first disagreement."""
import json
import re
import sys
from decimal import Decimal

INTEGER = re.compile(r'-?(0|[1-9][0-9]{0,18})')
NUMBER = re.compile(r'(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?')


def in_language(text, integer):
    if integer:
        return INTEGER.fullmatch(text) is not None and text != '-0'
    m = NUMBER.fullmatch(text)
    if not m:
        return False
    int_digits = 0 if m.group(2) == '0' else len(m.group(2))
    frac_digits = len(m.group(3) or '')
    exp_digits = len(m.group(4)) if m.group(4) is not None else 0
    return int_digits + frac_digits <= 15 and exp_digits <= 2


def satisfies(value, schema, number_of):
    if 'minimum' in schema and not value >= number_of(schema['minimum']):
        return False
    if 'exclusiveMinimum' in schema and not value > number_of(schema['exclusiveMinimum']):
        return False
    if 'maximum' in schema and not value <= number_of(schema['maximum']):
        return False
    if 'exclusiveMaximum' in schema and not value < number_of(schema['exclusiveMaximum']):
        return False
    return True


def main():
    n = accepted = 0
    with open(sys.argv[1], encoding='utf-8') as f:
        for line in f:
            case = json.loads(line, parse_float=Decimal, parse_int=Decimal)
            schema, text = case['schema'], case['text']
            integer = schema.get('type') == 'integer'
            expected = in_language(text, integer) and satisfies(Decimal(text), schema, Decimal)
            if expected and integer and 'multipleOf' in schema:
                expected = Decimal(text) % schema['multipleOf'] == 0
            if expected != case['accepted']:
                print(f'FAIL case {n}: text {text!r} under {json.dumps(schema, default=str)}: grammar '
                      f'{"accepts" if case["accepted"] else "refuses"}, expected the opposite')
                sys.exit(1)
            if not integer and in_language(text, False):
                as_double = satisfies(float(text), schema, lambda b: float(b))
                if as_double != expected:
                    print(f'FAIL case {n}: text {text!r} under {json.dumps(schema, default=str)}: binary64 '
                          f'says {as_double}, exact decimals say {expected}')
                    sys.exit(1)
            n += 1
            accepted += expected
    print(f'ok: {n} texts ({accepted} accepted) decided as the grammar did')


if __name__ == '__main__':
    main()
