import base64


def export(secret_half: str, path: str) -> None:
    """Writes the second half of the release flag, base64-encoded."""
    with open(path, "w") as out:
        out.write(base64.b64encode(secret_half.encode()).decode() + "\n")
