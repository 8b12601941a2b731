#!/usr/bin/python3
"""Independent check of constrained JSON output: every line of the input file is
{"schema": ..., "document": "<text>"}; the text must parse as JSON and validate against the
schema with python3-jsonschema (Draft 2020-12, formats checked where it can). Prints a
summary; exit 1 on the first failure (with the schema and the text), 77 when jsonschema is not
installed."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("skip: python3-jsonschema is not installed")
    sys.exit(77)


def main():
    n = 0
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            try:
                doc = json.loads(case["document"])
                # Formats are asserted where python can check them (date, uuid; date-time and
                # time need the optional rfc3339-validator package).
                checker = jsonschema.draft202012_format_checker
                jsonschema.Draft202012Validator(case["schema"], format_checker=checker).validate(doc)
            except Exception as e:  # noqa: BLE001 - any failure is reported with its case
                print(f"FAIL case {n}: {type(e).__name__}: {e}\nschema: {json.dumps(case['schema'])}\n"
                      f"document: {case['document']!r}")
                sys.exit(1)
            n += 1
    print(f"ok: {n} documents parse and validate")


if __name__ == "__main__":
    main()
