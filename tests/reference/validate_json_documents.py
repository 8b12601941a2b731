#!/usr/bin/python3
"""Independent check of constrained JSON output: every line of the input file is
{"schema": ..., "document": "<text>"}; the text must parse as JSON and validate against the
schema with python3-jsonschema (Draft 2020-12, formats checked where it can). Prints a
summary; exit 1 on the first failure (with the schema and the text), 77 when jsonschema is not
installed."""
import datetime
import json
import re
import sys

try:
    import jsonschema
except ImportError:
    print("skip: python3-jsonschema is not installed")
    sys.exit(77)


HOSTNAME = re.compile(r'(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
                      r'(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*')
TIME = re.compile(r'([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])')


def format_checker():
    """python3-jsonschema's checkers, plus RFC 1123 hostnames and RFC 3339 times, which it
    checks only with packages Debian does not have (fqdn, rfc3339-validator)."""
    checker = jsonschema.FormatChecker()
    checker.checkers = dict(jsonschema.draft202012_format_checker.checkers)

    def hostname(v):
        return not isinstance(v, str) or HOSTNAME.fullmatch(v) is not None

    def time(v):
        return not isinstance(v, str) or TIME.fullmatch(v) is not None

    def date_time(v):
        if not isinstance(v, str):
            return True
        date, sep, rest = v.partition('T')
        if not sep or not TIME.fullmatch(rest):
            return False
        datetime.date.fromisoformat(date)  # raises on a day that does not exist
        return True

    checker.checks('hostname')(hostname)
    checker.checks('time', raises=ValueError)(time)
    checker.checks('date-time', raises=ValueError)(date_time)
    return checker


def main():
    checker = format_checker()
    n = 0
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            try:
                doc = json.loads(case["document"])
                jsonschema.Draft202012Validator(case["schema"], format_checker=checker).validate(doc)
            except Exception as e:  # noqa: BLE001 - any failure is reported with its case
                print(f"FAIL case {n}: {type(e).__name__}: {e}\nschema: {json.dumps(case['schema'])}\n"
                      f"document: {case['document']!r}")
                sys.exit(1)
            n += 1
    print(f"ok: {n} documents parse and validate")


if __name__ == "__main__":
    main()
