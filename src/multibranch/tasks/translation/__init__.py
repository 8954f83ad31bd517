"""The translation task: everything it adds to the shared machinery, in one folder."""
