"""The HTTP edge: the ``xtml serve`` gateway (:mod:`.gateway`), the engines
behind it, and the OpenAI shapes of answers and streams (:mod:`.openai`).

Everything here stands on the facade (:class:`xtml.Template`); nothing below
the facade imports this package.
"""
