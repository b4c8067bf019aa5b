"""Developer tools apart from the product: the local server stack and the Spark standalone cluster."""
