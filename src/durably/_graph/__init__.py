"""The StateGraph: its builder, state schema and reducers, and its structure."""
