"""Keys: how arguments, results and code become digests and bytes (canonical encoding,
encoders, code fingerprints, revalidation of file and state dependencies, pickling).
Never touches a store."""
