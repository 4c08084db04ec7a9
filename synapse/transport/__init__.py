"""HTTP transport (aiohttp): server, client with retries, partners."""
