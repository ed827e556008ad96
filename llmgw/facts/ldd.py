"""ldd output turned into sentences a person can act on."""
import posixpath


def missing_libraries(output):
    """Return one sentence per unmet need in `ldd` output, each said once.

    Two shapes: 'libgomp.so.1 => not found' is a library that is not installed;
    "/lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found" is a system too
    old for the build (RHEL 9 against a GCC 12 build), said as such rather than
    as a missing library that is plainly there.
    """
    said, out = set(), []
    for raw in output.splitlines():
        line = raw.strip()
        if "not found" not in line:
            continue
        if ": version `" in line:
            lib, _, rest = line.partition(": version `")
            symbol = rest.split("'", 1)[0]
            sentence = f"{posixpath.basename(lib)} is too old (needs {symbol})"
            key = posixpath.basename(lib)
        else:
            lib = line.split("=>", 1)[0].strip()
            sentence = f"{lib} is not installed"
            key = sentence
        if key not in said:
            said.add(key)
            out.append(sentence)
    return out
