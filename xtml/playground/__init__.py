"""``xtml playground``: a page that shows a chat as the model sees it, token
by token (render, training mask, parse, stream, grammar), and the JSON API
behind it (:mod:`.app`, computed by :mod:`.views`). It needs the ``serve``
extra; the page is plain HTML, CSS and JavaScript in ``static/``."""
